"""Write a run's outputs: requests.csv, steps.csv, summary.json, scenario.toml."""

from __future__ import annotations

import json
import math
from pathlib import Path

import tomli_w

from simulator.io.scenario import to_dict


def _clean(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write_result(result, out_dir: str | Path, steps: bool = True) -> Path:
    """Write the files of a :class:`~simulator.Result` into ``out_dir`` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result.requests.to_csv(out / "requests.csv", index=False)
    if steps:
        result.steps.to_csv(out / "steps.csv", index=False)
    summary = {k: _clean(v) for k, v in result.summary.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "scenario.toml").write_text(tomli_w.dumps(to_dict(result.scenario)))
    return out
