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

import tomli_w

from simulator import files
from simulator.calibration import check, moe_fit
from simulator.calibration.params import to_toml
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


def run_check(gpu_name: str, data_dir: str, out: str | None = None) -> str:
    """Check the GPU's model against ``data_dir``; returns the text to print."""
    gpu = load_gpu(gpu_name, key="--gpu")
    data = check.load_data(data_dir)
    report = check.check(gpu, data)
    text = [f"calibration check of {gpu.name} on {data_dir} "
            f"(model: {gpu.calibration.source or 'uncalibrated'})",
            format_table(check.summarize(report))]
    if out:
        report.to_csv(files.out_file(out, "calibrate check --out"), index=False)
        text.append(f"  report in {out}")
    return "\n".join(text)


def run_fit(gpu_name: str, data_dir: str, out: str | None = None) -> str:
    """Fit the GPU's parameters on ``data_dir`` and write a GPU data file."""
    gpu = load_gpu(gpu_name, key="--gpu")
    if out:  # checked before the fit (minutes on a full data set)
        files.out_file(out, "calibrate fit --out")
    raw = read_gpu_file(gpu_name)
    data = check.load_data(data_dir)
    rows = sum(len(df) for df in data.values())
    today = datetime.date.today().isoformat()
    command = f"python -m simulator calibrate fit --gpu {gpu_name} --data {data_dir}"
    source = (f"fitted {today} on {rows} rows of {', '.join(f + '.csv' for f in data)} in "
              f"{data_dir} by `{command}`")
    cal = moe_fit.fit(gpu, data, source)
    # The default file is named for the preset or file given, never for the GPU file's
    # ``name`` (data from outside: "../../x" must not choose where we write).
    stem = re.sub(r"[^A-Za-z0-9._+-]+", "_", Path(gpu_name).stem).lstrip(".") or "gpu"
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


def main(action: str, gpu: str, data: str, out: str | None) -> int:
    if action == "check":
        print(run_check(gpu, data, out))
    elif action == "fit":
        print(run_fit(gpu, data, out))
    else:  # argparse restricts the choices; keep the error one line anyway
        raise ScenarioError(f"calibrate: unknown action {action!r} (allowed: check, fit)")
    return 0

