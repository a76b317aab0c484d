"""Golden outputs: every shipped workload (capped) and the engine variants of the speed
work (the Vidur workload, a faulted run, prefix-cached sessions, each with the fast path
on and off) give byte-identical files to the ones recorded in ``tests/data/golden/``.

Each case records the SHA-256 of every file a run writes (requests.csv, steps.csv,
timeseries.csv, gpu_timeseries.csv, alerts.csv, the decompressed trace, scenario.toml,
and summary.json less its wall time and event count) and the summary itself, so that a
failure says which figures moved. A change that is meant to move outputs re-records them:

    GOLDEN_BLESS=1 python -m pytest tests/test_golden_outputs.py

and the diff of ``tests/data/golden/*.json`` is reviewed with the change.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

from simulator import load_scenario, run
from simulator.io.scenario import read_toml
from simulator.io.writers import write_result

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "golden"
#: Scenarios written for the golden cases alone.
SCENARIOS = Path(__file__).parent / "data" / "golden_scenarios"
BLESS = os.environ.get("GOLDEN_BLESS") == "1"
#: Workload files that are not single runs (sweep grids, planner questions).
NOT_RUNS = {"grid-70b", "mooncake-70b-grid", "day-70b-grid", "plan-405b-2xdgx", "plan-70b-1xdgx",
            "plan-70b-hetero", "plan-8b-8gpu"}
REQUESTS = 100
TRACE_S = 30


def _caps(path: Path) -> list[str]:
    wl = read_toml(path).get("workload", {})
    if wl.get("arrival") == "trace" or "trace" in wl or "mooncake" in wl:
        return [f"workload.duration_s={TRACE_S}"]
    return [f"workload.num_requests={REQUESTS}"]


def _cases() -> dict[str, tuple[str | dict, list[str]]]:
    out: dict[str, tuple[str | dict, list[str]]] = {}
    for path in sorted((ROOT / "workloads").glob("*.toml")):
        if path.stem not in NOT_RUNS:
            out[path.stem] = (str(path), _caps(path) + ["output.steps=true"])
    default = str(ROOT / "workloads" / "llama70b-2xdgx.toml")
    for prof in ("none", "vllm-v1", "sglang", "trtllm"):
        for ff in ("true", "false"):
            out[f"variant-{prof}-ff{ff}"] = (default, [
                "workload.num_requests=60", f"engine.profile={prof}",
                f"engine.fast_forward={ff}", "output.steps=true"])
    # The speed paths' own cases: the Vidur workload, a faulted run (a repaired and a
    # permanent GPU fault) and prefix-cached sessions, with the profile unset and
    # "vllm-v1", the decode fast path on and off.
    speed = {"vidur": (ROOT / "benchmarks" / "vidur.toml", 2000),
             "faulted": (SCENARIOS / "faulted.toml", 1600),
             "sessions": (SCENARIOS / "sessions.toml", 600)}
    for name, (path, n) in speed.items():
        for prof in ("none", "vllm-v1"):
            for ff in ("true", "false"):
                out[f"speed-{name}-{prof}-ff{ff}"] = (str(path), [
                    f"workload.num_requests={n}", f"engine.profile={prof}",
                    f"engine.fast_forward={ff}", "output.steps=true"])
    return out


CASES = _cases()


def _content(path: Path) -> bytes:
    if path.name == "summary.json":
        s = json.loads(path.read_text())
        s.pop("wall_time_s", None)
        s.pop("simpy_events", None)
        return json.dumps(s, sort_keys=True).encode()
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes())
    return path.read_bytes()


def _record(out: Path) -> dict:
    files = {p.name.removesuffix(".gz"): hashlib.sha256(_content(p)).hexdigest()
             for p in sorted(out.iterdir()) if p.is_file()}
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("wall_time_s", None)
    summary.pop("simpy_events", None)
    return {"files": files, "summary": summary}


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_match_the_recorded_ones(name, tmp_path):
    source, sets = CASES[name]
    scenario = load_scenario(source, overrides=sets)
    write_result(run(scenario), tmp_path / name)
    got = _record(tmp_path / name)
    path = GOLDEN / f"{name}.json"
    if BLESS:
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    want = json.loads(path.read_text())
    moved = {k: (want["summary"].get(k), v) for k, v in got["summary"].items()
             if want["summary"].get(k) != v}
    assert got["summary"] == want["summary"], f"{name}: summary moved (recorded, now): {moved}"
    changed = [f for f in got["files"] if got["files"][f] != want["files"].get(f)]
    assert got["files"] == want["files"], f"{name}: files differ: {changed}"


def test_every_case_is_recorded_and_nothing_else():
    assert {p.stem for p in GOLDEN.glob("*.json")} == set(CASES)


FAST_FORWARD_PAIRS = [f"variant-{prof}" for prof in ("none", "vllm-v1", "sglang", "trtllm")] + [
    f"speed-{name}-{prof}" for name in ("vidur", "faulted", "sessions")
    for prof in ("none", "vllm-v1")]


@pytest.mark.parametrize("case", FAST_FORWARD_PAIRS)
def test_fast_forward_changes_no_output(case):
    """Decode fast-forward is a speed path: with it on and off every file but the
    resolved scenario (which records the switch) is the same."""
    on, off = (json.loads((GOLDEN / f"{case}-ff{ff}.json").read_text())["files"]
               for ff in ("true", "false"))
    on.pop("scenario.toml"), off.pop("scenario.toml")
    assert on == off
