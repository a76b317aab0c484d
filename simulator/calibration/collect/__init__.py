"""``calibrate collect``: time the kernels a GPU's fit needs and write ``calibrate fit``'s CSVs.

On a machine with the GPU and PyTorch, ``python -m simulator calibrate collect --gpu NAME
--out DIR`` times the shape plan of :mod:`.shapes` with :class:`.torch_ops.TorchTimer` and
writes ``gemm.csv``, ``attention_context.csv``, ``attention_generation.csv`` and
``nccl.csv`` in the columns ``calibrate check|fit`` read, plus a README.md with the
provenance (device, PyTorch and CUDA versions, backends, command, date, rows per family,
rows skipped and why). ``--timer model`` runs the same plan on the simulator's own model
of ``--gpu`` instead (a dry run; the file it writes says it is not a measurement).

Rows are appended to ``<family>.partial.csv`` as they are timed and the file becomes
``<family>.csv`` when the family is complete, so a stopped collection (Ctrl-C, a crash, a
lost machine) loses at most the row in flight: the same command resumes it, and finished
families are kept as they are.
"""

from __future__ import annotations

import csv
import datetime
import os
import platform
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from simulator.calibration.collect import shapes as shape_plan
from simulator.calibration.collect.timers import ModelTimer, Timer
from simulator.errors import ScenarioError
from simulator.hardware.specs import GPUSpec, load_gpu

FAMILIES = shape_plan.FAMILIES
TIMERS = ("torch", "model")


@dataclass
class Collection:
    """What one ``collect`` call did: rows written, kept and skipped per family."""

    out: Path
    timer: str
    written: dict[str, int] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # (family, reason) -> rows

    def lines(self) -> list[str]:
        text = [f"calibration collect into {self.out}/ ({self.timer})"]
        text += [f"  {f}.csv: {n:,} rows" for f, n in self.written.items()]
        text += [f"  {f}.csv: already complete, kept" for f in self.kept]
        text += [f"  {f}: {n:,} rows skipped ({why})" for (f, why), n in self.skipped.items()]
        return text


def parse_families(text: str | None) -> tuple[str, ...]:
    """``--families gemm,nccl`` -> the family names (all when None)."""
    if text is None:
        return FAMILIES
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in FAMILIES]
    if bad or not names:
        raise ScenarioError(f"--families: {bad[0][:40] if bad else text[:40]!r} is not a "
                            f"family (allowed: {', '.join(FAMILIES)})")
    return names


def make_timer(kind: str, gpu: GPUSpec, noise: float = 0.0, seed: int = 0) -> Timer:
    """The timer named by ``--timer``."""
    if kind == "model":
        if not (0 <= noise <= 1):
            raise ScenarioError(f"--noise: {noise!r} is not in [0, 1] (a lognormal sigma)")
        return ModelTimer(gpu, noise, seed)
    if kind != "torch":
        raise ScenarioError(f"--timer: {kind[:20]!r} is not known (allowed: "
                            f"{', '.join(TIMERS)})")
    try:
        from simulator.calibration.collect.torch_ops import TorchTimer  # noqa: PLC0415
    except ImportError:
        raise ScenarioError("--timer torch: PyTorch is not installed here (install a CUDA "
                            "build of torch on the GPU machine; --timer model runs the "
                            "plan on the cost model instead)") from None
    try:
        return TorchTimer()
    except RuntimeError as exc:
        raise ScenarioError(f"--timer torch: {exc}") from None


def _dtypes(gpu: GPUSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """GEMM and KV-cache dtypes to collect: 16-bit, and FP8 where the GPU has FP8 cores."""
    fp8 = ("fp8",) if "fp8" in gpu.peak_flops else ()
    return ("bfloat16", *fp8), ("bfloat16", *fp8)


def _done(partial: Path, shapes: pd.DataFrame) -> pd.Series:
    """Which shape rows the partial file already holds."""
    if not partial.exists():
        return pd.Series(False, index=shapes.index)
    have = pd.read_csv(partial)
    if have.empty:
        return pd.Series(False, index=shapes.index)
    keys = list(shapes.columns)
    merged = shapes.merge(have[keys].drop_duplicates(), on=keys, how="left", indicator=True)
    return pd.Series((merged["_merge"] == "both").to_numpy(), index=shapes.index)


def collect_family(timer: Timer, family: str, shapes: pd.DataFrame, out: Path,
                   report: Collection, progress: bool = True) -> None:
    """Time one family's shapes, appending to ``<family>.partial.csv``; rename when done."""
    final, partial = out / f"{family}.csv", out / f"{family}.partial.csv"
    todo = shapes[~_done(partial, shapes)].reset_index(drop=True)
    new = not partial.exists() or partial.stat().st_size == 0
    columns = [*shapes.columns, "kernel_source", "latency_us"]
    with partial.open("a", newline="") as fh:
        writer = csv.writer(fh)
        if new:
            writer.writerow(columns)
        bar = tqdm(total=len(todo), desc=family, unit="row", disable=not progress,
                   leave=False)
        rows = todo.to_dict("records")
        for i, latency_us, source in timer.measure(family, todo):
            bar.update(1)
            if latency_us is None:
                report.skipped[(family, source)] += 1
                continue
            writer.writerow([*rows[i].values(), source, f"{latency_us:.4f}"])
            fh.flush()
        bar.close()
    total = len(pd.read_csv(partial))
    if total == 0:
        partial.unlink()
        return
    os.replace(partial, final)
    report.written[family] = total


def write_readme(out: Path, gpu: GPUSpec, timer: Timer, report: Collection,
                 command: str) -> None:
    """The collection's provenance, beside its CSVs."""
    rows = {f: len(pd.read_csv(out / f"{f}.csv")) for f in FAMILIES
            if (out / f"{f}.csv").exists()}
    lines = [f"# Kernel timings for calibrating `{gpu.name}`", "",
             f"Collected {datetime.date.today().isoformat()} by `{command}`.", "",
             f"- Timer: {timer.description}.",
             f"- Host: Python {platform.python_version()} on {platform.platform(terse=True)}.",
             "- Shapes: `simulator/calibration/collect/shapes.py` (token counts and feature "
             "sizes after NVIDIA AIConfigurator's collector, Apache-2.0).", "",
             "| file | rows |", "|---|---|"]
    lines += [f"| {f}.csv | {n:,} |" for f, n in rows.items()]
    if report.skipped:
        lines += ["", "Rows not timed on this machine:", ""]
        lines += [f"- {f}: {n:,} ({why})" for (f, why), n in report.skipped.items()]
    lines += ["", f"Fit: `python -m simulator calibrate fit --gpu {gpu.name} --data {out}`."]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def collect(gpu_name: str, out: str | Path, families: tuple[str, ...] = FAMILIES,
            quick: bool = False, timer: str | Timer = "torch", noise: float = 0.0,
            seed: int = 0, progress: bool = True, command: str | None = None) -> Collection:
    """Collect the families' shape plans on ``timer`` into ``out``; see the module doc."""
    gpu = load_gpu(gpu_name, key="--gpu")
    clock = make_timer(timer, gpu, noise, seed) if isinstance(timer, str) else timer
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ScenarioError(f"--out: {str(out)[:60]!r} exists and is not a folder")
    if out.is_symlink():
        raise ScenarioError(f"--out: {str(out)[:60]!r} is a symbolic link; give a folder")
    out.mkdir(parents=True, exist_ok=True)
    gemm_dt, kv_dt = _dtypes(gpu)
    plan = shape_plan.plan(families, gemm_dt, kv_dt, clock.max_gpus(), quick)
    report = Collection(out, timer if isinstance(timer, str) else type(timer).__name__)
    command = command or f"python -m simulator calibrate collect --gpu {gpu_name} --out {out}"
    try:
        for family, shapes in plan.items():
            if (out / f"{family}.csv").exists():
                report.kept.append(family)
                continue
            collect_family(clock, family, shapes, out, report, progress)
    finally:
        write_readme(out, gpu, clock, report, command)
    return report
