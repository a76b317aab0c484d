"""A fuzzer over scenario dicts: hostile and valid values in every key, one contract.

:func:`scenarios` draws the toy scenario with a few keys replaced: a numeric key of the
schema by a value in its range, at its bounds, outside them, not finite or of another
kind; a table by a scalar; a name by one with separators, quotes or ``$``; an unknown key;
deep nesting. :func:`check` runs ``validate`` (and ``run`` when the scenario is small) in
process and holds the contract of the command line: exit 0 and the run's invariants
(every request counted once, time never backwards, TTFT <= E2E, tokens conserved), or
exit 2 with exactly one line on stderr and no traceback. ``tests/test_fuzz_scenarios.py``
draws a few examples per CI run; ``benchmarks/validation/fuzz_scenarios.py`` draws many.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
from pathlib import Path

import pandas as pd
import tomli_w
from conftest import toy_scenario
from hypothesis import strategies as st
from test_bad_input_corpus import NUMERIC

from simulator.cli import main
from simulator.io.scenario import key_bounds

BASE = toy_scenario(workload={"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 12,
                              "prompt_tokens": {"dist": "uniform", "min": 10, "max": 300},
                              "output_tokens": {"dist": "uniform", "min": 1, "max": 20}},
                    engine={"max_num_seqs": 8, "max_num_batched_tokens": 512})
KEYS = [k for k, _, _ in NUMERIC]
#: A run is simulated only when it is this small (validate alone otherwise).
SMALL_REQUESTS = 64
HOSTILE_TEXT = ["a,b", "a\nb", 'a"b', "$x$", "<b>&", "", "x" * 300, "../../etc/passwd"]


def _number_for(key: str) -> st.SearchStrategy:
    b = key_bounds(key)
    lo, hi = b.get("min", b.get("gt", -1e3)), b.get("max", 1e6)
    edge = [lo, hi, lo - 1, hi + 1, 0, -1, 2**63, 1e308]
    return st.one_of(st.sampled_from(edge), st.integers(int(max(lo, -1e6)), int(min(hi, 1e6))),
                     st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from([math.nan, math.inf, -math.inf]))


def _other_kind() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(HOSTILE_TEXT), st.booleans(), st.just([1, 2]),
                     st.just({"a": 1}), st.just([[[[[]]]]]))


def _put(data: dict, key: str, value) -> None:
    node = data
    *path, last = key.split(".")
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


@st.composite
def scenarios(draw) -> dict:
    """The toy scenario with one to four keys replaced (see the module docstring)."""
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["number", "number", "number", "kind", "table", "name",
                                     "unknown", "pool"]))
        if kind == "number":
            key = draw(st.sampled_from(KEYS))
            _put(data, key, draw(_number_for(key)))
        elif kind == "kind":
            _put(data, draw(st.sampled_from(KEYS)), draw(_other_kind()))
        elif kind == "table":
            data[draw(st.sampled_from(["engine", "workload", "cluster", "model", "slo"]))] = (
                draw(_other_kind()))
        elif kind == "name":
            data["name"] = draw(st.sampled_from(HOSTILE_TEXT))
        elif kind == "unknown":
            _put(data, draw(st.sampled_from(["engine.x", "workload.nmu_requests", "zzz"])), 1)
        else:
            data["pools"] = [{"name": draw(st.sampled_from(["p", *HOSTILE_TEXT])),
                              "role": "mixed", "nodes": 1, "tp": 1,
                              "dp": draw(st.integers(0, 3)),
                              "engine": {"max_num_seqs": draw(st.integers(-1, 64)),
                                         "scheduler_args": draw(st.sampled_from(
                                             [{}, {"x": 1}, {"chunk_size": "8"}]))}}]
    return data


def _small(data: dict) -> bool:
    w = data.get("workload")
    return (isinstance(w, dict) and w.get("arrival") == "poisson" and "duration_s" not in w
            and isinstance(w.get("num_requests"), int)
            and 0 < w["num_requests"] <= SMALL_REQUESTS)


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def check(data: dict, folder: Path) -> str:
    """Hold the contract for one scenario dict; returns "ok", "refused" or "validated"."""
    path = folder / "s.toml"
    try:
        path.write_text(tomli_w.dumps(data))
    except (TypeError, ValueError):  # nan in a place TOML cannot write: not a scenario file
        return "unwritable"
    rc, err = _cli(["validate", str(path)])
    assert rc in (0, 2), (rc, err)
    assert "Traceback" not in err
    if rc == 2:
        assert len(err.strip().splitlines()) >= 1 and err.endswith("\n"), err
        lines = err.strip().splitlines()
        # Every problem on its own line, each naming the file; one problem -> one line.
        assert all(line.startswith(str(path)) for line in lines), err
        return "refused"
    if not _small(data):
        return "validated"
    out = folder / "out"
    rc, err = _cli(["run", str(path), "--out", str(out), "--quiet"])
    assert rc in (0, 2) and "Traceback" not in err, (rc, err)
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, err
        return "refused"
    invariants(out)
    return "ok"


def invariants(out: Path) -> None:
    """The run folder's requests and summary agree with the definitions."""
    req = pd.read_csv(out / "requests.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(req) == summary["requests_total"]
    assert req["request_id"].is_unique
    counted = sum(summary[k] for k in ("requests_completed", "requests_rejected",
                                       "requests_dropped", "requests_failed"))
    assert counted == len(req)
    done = req[req["status"] == "completed"]
    assert (done["first_token_s"] >= done["arrival_s"]).all()
    assert (done["finish_s"] >= done["first_token_s"]).all()
    assert (done["ttft_s"] <= done["e2e_s"] + 1e-12).all()
    assert (done["generated_tokens"] == done["output_tokens"]).all()
