"""``python -m simulator calibrate check|fit``: read measurements, call check/fit, write files.

check: predict every row of the CSVs in ``--data`` with the GPU's current model, print rows,
median and p90 |error| % per family, and optionally write the rows with ``family``,
``predicted_us`` and ``error_pct`` added. fit: refit the GPU's parameters on those CSVs and
write a GPU data file (datasheet numbers plus the new ``[calibration]``) that a node TOML
can point at.
"""

from __future__ import annotations

import datetime
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import tomli_w

from simulator import files
from simulator.calibration import aic, check, engines, moe_fit
from simulator.calibration.fit import GEMM_FREE
from simulator.calibration.params import FALLBACK, Calibration, to_toml
from simulator.errors import ScenarioError
from simulator.hardware.specs import load_gpu, read_gpu_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def format_table(summary) -> str:
    lines = [f"  {'family':<34}{'rows':>8}{'median |err| %':>17}{'p90 |err| %':>14}"]
    for name, row in summary.iterrows():
        lines.append(f"  {name:<34}{int(row['rows']):>8}{row['median_abs_error_pct']:>17.1f}"
                     f"{row['p90_abs_error_pct']:>14.1f}")
    return "\n".join(lines)


def _data(gpu_name: str, data_dir: str, engine: str | None, which: int | None):
    """The family tables: CSVs of a folder, or with ``engine`` the AIConfigurator database
    at ``data_dir`` (half ``which`` of every table; None: all rows)."""
    if engine is None:
        return check.load_data(data_dir)
    data = aic.load(data_dir, gpu_name, engine)
    return data if which is None else aic.half(data, which)


def run_check(gpu_name: str, data_dir: str, out: str | None = None,
              engine: str | None = None) -> str:
    """Check the GPU's model against ``data_dir``; returns the text to print. With
    ``engine``: the engine's calibration on the database's held-back half (half 1)."""
    gpu = load_gpu(gpu_name, key="--gpu")
    if engine is not None:
        gpu = engines.engine_gpu(gpu, engines.PROFILE_OF_ENGINE[engine])
    data = _data(gpu_name, data_dir, engine, 1)
    report = check.check(gpu, data)
    text = [f"calibration check of {gpu.name} on {data_dir} "
            f"{f'({engine} tables, held-back half) ' if engine else ''}"
            f"(model: {gpu.calibration.source or 'uncalibrated'})",
            format_table(check.summarize(report))]
    if out:
        report.to_csv(files.out_file(out, "calibrate check --out"), index=False)
        text.append(f"  report in {out}")
    return "\n".join(text)


#: Data families -> the calibration sections they fit.
SECTIONS_OF = {"gemm": ("gemm", "elementwise"), "attention_context": ("prefill",),
               "attention_generation": ("decode",), "nccl": ("collectives",),
               "vllm_custom_allreduce": ("collectives",), "moe": ("moe",),
               "mla_context": ("mla_prefill", "mla_decode"),
               "mla_generation": ("mla_decode",), "alltoall": ("alltoall",)}


def measured_only(cal: Calibration, data: dict, start: Calibration) -> Calibration:
    """``cal`` with what no table of ``data`` measured dropped: per-dtype sections no
    family fitted, and entries still equal to the ``start`` calibration's (a dtype or mode
    the tables lack). The engine's fit file holds only what its tables fitted
    (:func:`engines.engine_gpu` completes the rest, and says from where)."""
    fitted = {sec for family in data for sec in SECTIONS_OF[family]}
    out = {}
    for sec in engines.SECTIONS_BY_DTYPE:
        old = getattr(start, sec)
        out[sec] = ({k: p for k, p in getattr(cal, sec).items() if old.get(k) != p}
                    if sec in fitted else {})
    return replace(cal, **out)


def prune_gemm(gpu, cal: Calibration, gemm) -> tuple[Calibration, list[str]]:
    """Drop each fitted GEMM dtype whose own parameters predict its rows worse (median
    |error|) than the dtype it falls back to (``params.FALLBACK``), or sit at an upper
    bound of the fit's box (launch latency or overlap exponent: the solver found no
    physical optimum): a kernel the form does not capture is then priced as its nearest
    kernel. Returns the names dropped, with why."""
    dropped = []
    caps = {name: hi * unit for name, _, hi, unit in GEMM_FREE}
    dtypes = check._dtype("gemm", "dtype", gemm["dtype"])
    for dt in sorted(cal.gemm):
        rows = gemm[dtypes == dt]
        rest = {k: v for k, v in cal.gemm.items() if k != dt}
        if not len(rows) or not any(k in rest for k in FALLBACK.get(dt, ())):
            continue
        err = [float(np.median(np.abs(check.predict_gemm(replace(gpu, calibration=c), rows)
                                      / (rows["latency_us"].to_numpy() * 1e-6) - 1)))
               for c in (cal, replace(cal, gemm=rest))]
        p = cal.gemm[dt]
        pinned = [k for k in ("launch_s", "overlap") if getattr(p, k) >= 0.999 * caps[k]]
        if err[1] < err[0] or pinned:
            cal = replace(cal, gemm=rest)
            dropped.append(f"gemm.{dt} (median error {err[0]:.0%}"
                           f"{', at the bound of ' + ' and '.join(pinned) if pinned else ''}; "
                           f"as {next(k for k in FALLBACK[dt] if k in rest)}: {err[1]:.0%})")
    return cal, dropped


def run_fit(gpu_name: str, data_dir: str, out: str | None = None,
            engine: str | None = None) -> str:
    """Fit the GPU's parameters on ``data_dir`` and write a GPU data file; with ``engine``,
    fit on a sample of half 0 of the engine's database tables and write the fit file that
    :mod:`engines` ships (``data/fits/<gpu>_<engine>.toml``)."""
    gpu = load_gpu(gpu_name, key="--gpu")
    if out:  # checked before the fit (minutes on a full data set)
        files.out_file(out, "calibrate fit --out")
    raw = read_gpu_file(gpu_name)
    data = _data(gpu_name, data_dir, engine, 0)
    if engine is not None:
        data = aic.sample(data)
        gpu = engines.engine_gpu(gpu, engines.PROFILE_OF_ENGINE[engine])
    rows = sum(len(df) for df in data.values())
    today = datetime.date.today().isoformat()
    flag = f" --engine {engine}" if engine else ""
    command = f"python -m simulator calibrate fit --gpu {gpu_name}{flag} --data {data_dir}"
    what = (f"{engine} tables of AIConfigurator (half 0, up to {aic.FIT_ROWS} rows per "
            f"variant)" if engine else ", ".join(f + ".csv" for f in data))
    source = f"fitted {today} on {rows} rows of {what} in {data_dir} by `{command}`"
    cal = moe_fit.fit(gpu, data, source)
    # The default file is named for the preset or file given, never for the GPU file's
    # ``name`` (data from outside: "../../x" must not choose where we write).
    stem = re.sub(r"[^A-Za-z0-9._+-]+", "_", Path(gpu_name).stem).lstrip(".") or "gpu"
    if engine is not None:
        cal = measured_only(cal, data, gpu.calibration)
        if "gemm" in data:
            cal, dropped = prune_gemm(gpu, cal, data["gemm"])
            if dropped:
                cal = replace(cal, source=f"{cal.source}; not kept: {', '.join(dropped)}")
        path = files.out_file(out or Path("runs") / "calibration" / f"{stem}_{engine}.toml",
                              "calibrate fit --out")
        header = (f"# Kernel calibration of {gpu.name} under {engine}: `{command}`, {today}.\n"
                  f"# Data: NVIDIA AIConfigurator's measured tables (Apache-2.0), "
                  f"{rows} rows. Forms: docs/cost-model.md.")
        text = to_toml(cal, header) + "\n"
    else:
        path = files.out_file(out or Path("runs") / "calibration" / f"{stem}.toml",
                              "calibrate fit --out")
        datasheet = {k: v for k, v in raw.items() if k not in ("calibration", "efficiency")}
        header = (f"# Calibration of {gpu.name}: fitted by `{command}` on {today}.\n"
                  f"# Data: {rows} measured rows ({', '.join(data)}). Forms and parameters: "
                  f"docs/cost-model.md.")
        text = tomli_w.dumps(datasheet) + "\n" + to_toml(cal, header) + "\n"
    tomllib.loads(text)  # what we write must read back
    path.write_text(text)
    report = check.check(replace(gpu, calibration=cal), data)
    return "\n".join([f"calibration fit of {gpu.name} on {data_dir}: wrote {path}",
                      format_table(check.summarize(report))])


def main(action: str, gpu: str, data: str, out: str | None, engine: str | None = None) -> int:
    if action == "check":
        print(run_check(gpu, data, out, engine))
    elif action == "fit":
        print(run_fit(gpu, data, out, engine))
    else:  # argparse restricts the choices; keep the error one line anyway
        raise ScenarioError(f"calibrate: unknown action {action!r} (allowed: check, fit)")
    return 0
