"""Bad scenarios fail cleanly: exit status 2, one line per problem on stderr naming the
scenario file, the offending key and what is allowed, and never a Traceback."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import pytest

from simulator.cli import main

BASE = {
    "name": "t",
    "seed": 1,
    "model": {"name": "llama-3.1-8b"},
    "cluster": {"topology": "dgx-h100", "nodes": 1},
    "parallel": {"tp": 1},
    "workload": {"arrival": "poisson", "rate_per_s": 1.0, "num_requests": 5,
                 "prompt_tokens": 128, "output_tokens": 16},
}
DROP = object()  # in an override: remove the key
TRACE = {"workload": {"arrival": "trace", "rate_per_s": DROP, "num_requests": DROP}}


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(v) if isinstance(v, str) else repr(v)


def scenario_text(**overrides) -> str:
    """BASE with ``section={key: value}`` overrides merged in, as TOML text."""
    data = copy.deepcopy(BASE)
    for sec, val in overrides.items():
        if isinstance(val, dict):
            target = data.setdefault(sec, {})
            for k, v in val.items():
                target.pop(k, None) if v is DROP else target.__setitem__(k, v)
        else:
            data[sec] = val
    top = [f"{k} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + "\n".join(f"{kk} = {_value(vv)}" for kk, vv in v.items())
              for k, v in data.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n" + "\n".join(tables) + "\n"


@pytest.fixture
def write(tmp_path):
    def _write(text: str | None = None, name: str = "s.toml", **overrides):
        path = tmp_path / name
        path.write_text(text if text is not None else scenario_text(**overrides))
        return path
    return _write


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_rejected(capsys, path, *needles, cmd="validate", extra=(), lines=1):
    argv = [cmd, path, *extra] + (["--out", path.parent / "out", "--quiet"] if cmd == "run"
                                  else [])
    code, out, err = cli(capsys, *argv)
    assert code == 2, (code, out, err)
    assert err.strip(), "stderr is empty"
    assert "Traceback" not in err
    assert str(path) in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    err_lines = err.strip().splitlines()
    assert len(err_lines) == lines, err_lines
    assert all(line.startswith(f"{path}: ") for line in err_lines)
    return err


def test_good_minimal_scenario_validates_and_runs(write, capsys, tmp_path):
    path = write()
    code, out, err = cli(capsys, "validate", path)
    assert code == 0, err
    assert "valid" in out and err == ""
    outdir = tmp_path / "out"
    code, out, err = cli(capsys, "run", path, "--out", outdir, "--quiet")
    assert code == 0, err
    for name in ("requests.csv", "steps.csv", "summary.json", "scenario.toml"):
        assert (outdir / name).is_file(), name
    assert json.loads((outdir / "summary.json").read_text())["requests_completed"] == 5


def test_unknown_key_did_you_mean(write, capsys):
    path = write(parallel={"tpp": 4})
    assert_rejected(capsys, path, "parallel.tpp", "did you mean 'tp'")


def test_unknown_section_did_you_mean(write, capsys):
    path = write(enigne={"max_num_seqs": 4})
    assert_rejected(capsys, path, "enigne", "did you mean 'engine'")


def test_wrong_type(write, capsys):
    path = write(parallel={"tp": "four"})
    assert_rejected(capsys, path, "parallel.tp", "expected int", "'four'")


@pytest.mark.parametrize("rate", [0, -1])
def test_rate_must_be_positive(write, capsys, rate):
    path = write(workload={"rate_per_s": rate})
    assert_rejected(capsys, path, "workload.rate_per_s", "> 0")


@pytest.mark.parametrize("cmd", ["validate", "run"])
def test_tp_must_divide_heads(write, capsys, cmd):
    path = write(parallel={"tp": 3})
    assert_rejected(capsys, path, "parallel.tp", "32 attention heads",
                    "allowed: 1, 2, 4, 8, 16, 32", cmd=cmd)


def test_layout_larger_than_cluster(write, capsys):
    path = write(parallel={"tp": 8, "dp": 2})
    assert_rejected(capsys, path, "parallel", "16 GPUs", "the cluster has 8")


def test_model_does_not_fit(write, capsys):
    path = write(model={"name": "llama-3.1-405b"})
    err = assert_rejected(capsys, path, "model.name", "does not fit", "short by", "GiB")
    assert "Raise tp or pp" in err


def test_missing_trace_file(write, capsys):
    path = write(workload={**TRACE["workload"], "trace": "nope.csv"})
    assert_rejected(capsys, path, "workload.trace", "nope.csv", "not found", cmd="run")


@pytest.mark.parametrize("csv, needles", [
    ("a,b\n1,2\n", ["arrival_s", "has: a, b"]),
    ("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,abc,10\n",
     ["row 3, column prompt_tokens", "'abc'"]),
], ids=["missing-columns", "non-numeric"])
def test_malformed_trace(write, capsys, tmp_path, csv, needles):
    (tmp_path / "bad.csv").write_text(csv)
    path = write(workload={**TRACE["workload"], "trace": "bad.csv"})
    assert_rejected(capsys, path, "workload.trace", "bad.csv", *needles, cmd="run")


@pytest.mark.parametrize("overrides, needles", [
    ({"model": {"name": "llama-9"}}, ["model.name", "unknown model", "llama-3.1-8b"]),
    ({"cluster": {"topology": "dgx-h1000"}}, ["cluster.topology", "presets:", "dgx-h100"]),
    ({"router": {"policy": "least_outstandin"}},
     ["router.policy", "did you mean 'least_outstanding'"]),
    ({"engine": {"scheduler": "lightllm"}}, ["engine.scheduler", "allowed: vllm"]),
], ids=["model", "topology", "router", "scheduler"])
def test_unknown_names(write, capsys, overrides, needles):
    assert_rejected(capsys, write(**overrides), *needles)


def test_batched_tokens_below_max_seqs(write, capsys):
    path = write(engine={"max_num_seqs": 64, "max_num_batched_tokens": 32})
    assert_rejected(capsys, path, "engine.max_num_batched_tokens", ">= engine.max_num_seqs")


def test_not_valid_toml(write, capsys):
    path = write("name = \n[model\n")
    assert_rejected(capsys, path, "not valid TOML", "line 1")


def test_scenario_file_missing(capsys, tmp_path):
    assert_rejected(capsys, tmp_path / "missing.toml", "scenario file not found")


@pytest.mark.parametrize("cmd", ["validate", "run"])
def test_set_override_wrong_type(write, capsys, cmd):
    assert_rejected(capsys, write(), "parallel.tp", "expected int", "'abc'", cmd=cmd,
                    extra=["--set", "parallel.tp=abc"])


def test_all_problems_reported(write, capsys):
    path = write(parallel={"tpp": 4}, workload={"rte": 2})
    assert_rejected(capsys, path, "parallel.tpp", "did you mean 'tp'", "workload.rte",
                    "allowed: arrival, rate_per_s", lines=2)


def test_real_process_exits_2_without_traceback(write):
    path = write(parallel={"tpp": 4})
    proc = subprocess.run([sys.executable, "-m", "simulator", "run", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{path}: parallel.tpp: unknown key (did you mean 'tp'?)" in proc.stderr
    assert proc.stdout == ""


# --- Regressions of bugs found while writing these tests -------------------------------

def test_validate_checks_trace_file(write, capsys):
    path = write(workload={**TRACE["workload"], "trace": "nope.csv"})
    assert_rejected(capsys, path, "workload.trace", "not found")


def test_missing_trace_column_message_not_double_wrapped(write, capsys, tmp_path):
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    path = write(workload={**TRACE["workload"], "trace": "bad.csv"})
    err = assert_rejected(capsys, path, "workload.trace", cmd="run")
    assert err.count("workload.trace") == 1 and "malformed value" not in err


@pytest.mark.parametrize("cmd, overrides, key", [
    ("validate", {"engine": {"gpu_memory_utilization": math.nan}},
     "engine.gpu_memory_utilization"),
    ("validate", {"workload": {"rate_per_s": math.nan}}, "workload.rate_per_s"),
    ("run", {"workload": {"num_requests": DROP, "duration_s": math.inf}},
     "workload.duration_s"),
    ("run", {"seed": -1}, "seed"),
], ids=["utilization-nan", "rate-nan", "duration-inf", "seed-negative"])
def test_non_finite_and_negative_values_rejected(write, capsys, cmd, overrides, key):
    assert_rejected(capsys, write(**overrides), key, cmd=cmd)
