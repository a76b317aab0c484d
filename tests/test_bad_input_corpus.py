"""The bad-input corpus: every kind of bad scenario value, trace, path and command line.

Each case runs ``python -m simulator run <scenario> --out <tmp>/out`` in-process and must
exit 2 with exactly one line on stderr that names the key (or option, or file), no
traceback, and nothing written: no output folder, no ``runs/`` in the working directory,
no temporary folder left behind. Numeric cases are generated from the schema, so every
numeric key is covered (below its range, above it, not finite, wrong type); hypothesis then
draws values outside each key's range. A few cases go through a real subprocess.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.io.scenario import key_bounds
from simulator.io.schema import SECTIONS, RandomFaults

BASE = {
    "name": "t",
    "seed": 1,
    "model": {"name": "llama-3.1-8b"},
    "cluster": {"topology": "dgx-h100", "nodes": 1},
    "parallel": {"tp": 1},
    "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512},
    "workload": {"arrival": "poisson", "rate_per_s": 1.0, "num_requests": 5,
                 "prompt_tokens": 128, "output_tokens": 16},
}
DROP = object()
GOOD_TRACE = "arrival_s,prompt_tokens,output_tokens\n0,100,10\n10,200,20\n"
TRACE_WORKLOAD = {"arrival": "trace", "rate_per_s": DROP, "num_requests": DROP,
                  "trace": "trace.csv"}


def _numeric_keys() -> list[tuple[str, str, type]]:
    """(dotted key, field name, int or float) of every numeric key of the schema."""
    out = []
    for section, cls in [*SECTIONS.items(), ("faults.random", RandomFaults)]:
        for f in dataclasses.fields(cls):
            base = str(f.type).split(" ")[0].split("|")[0]
            if base in ("int", "float"):
                out.append((f"{section}.{f.name}", f.name, int if base == "int" else float))
    return out


NUMERIC = _numeric_keys()


def _place(data: dict, key: str, value) -> dict:
    """``data`` with dotted ``key`` set to ``value`` (DROP removes it)."""
    data = copy.deepcopy(data)
    *path, last = key.split(".")
    node = data
    for part in path:
        node = node.setdefault(part, {})
    if value is DROP:
        node.pop(last, None)
    else:
        node[last] = value
    return data


def _with(**sections) -> dict:
    data = copy.deepcopy(BASE)
    for sec, val in sections.items():
        if isinstance(val, dict) and isinstance(data.get(sec), dict):
            for k, v in val.items():
                data = _place(data, f"{sec}.{k}", v)
        else:
            data[sec] = val
    return data


def _outside(key: str, typ: type) -> list[tuple[str, object]]:
    """Values just and far outside ``key``'s range, and of the wrong kind."""
    b = key_bounds(key)
    cases = []
    if "max" in b:
        hi = b["max"]
        cases.append(("above", int(hi) + 1 if typ is int else hi * 1.5))
        cases.append(("far-above", 2**62 if typ is int else 1e300))
    if "gt" in b:
        cases.append(("at-gt", int(b["gt"]) if typ is int else float(b["gt"])))
    if "min" in b:
        lo = b["min"]
        cases.append(("below", int(lo) - 1 if typ is int else (lo / 10 if lo > 0 else -1.0)))
    cases.append(("negative", -1 if typ is int else -1e-30))
    if typ is float:
        cases += [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf)]
    else:
        cases.append(("fraction", 1.5))
    cases += [("string", "12"), ("bool", True)]
    seen, out = set(), []
    for label, v in cases:  # a value that is in range for this key is no bad case
        ok = (not isinstance(v, (bool, str)) and isinstance(v, (int, float))
              and not (typ is int and isinstance(v, float)) and math.isfinite(v)
              and v > b.get("gt", -math.inf) and v >= b.get("min", -math.inf)
              and v <= b.get("max", math.inf))
        if not ok and repr(v) not in seen:
            seen.add(repr(v))
            out.append((label, v))
    return out


def _base_for(key: str) -> dict:
    """The base scenario a key's bad value goes into (where the key matters)."""
    if key.startswith("faults.random."):
        return _with(faults={"random": {"gpu_mtbf_h": 1000.0}})
    if key in ("workload.time_scale", "workload.start_s"):
        return _with(workload=TRACE_WORKLOAD)
    if key in ("workload.concurrency", "workload.think_time_s"):
        return _with(workload={"arrival": "closed_loop", "rate_per_s": DROP,
                               "concurrency": 2})
    return copy.deepcopy(BASE)


GENERATED = [pytest.param(_place(_base_for(key), key, v), [key], id=f"{key}-{label}")
             for key, _, typ in NUMERIC for label, v in _outside(key, typ)]

LENGTHS = [
    (0, "zero"), (-5, "negative"), (2**40, "huge"), (1e30, "float"), ("abc", "string"),
    ({"dist": "constant", "value": 0}, "constant-0"),
    ({"dist": "constant", "value": 1e30}, "constant-1e30"),
    ({"dist": "constant", "value": 100.7}, "constant-fraction"),
    ({"dist": "constant", "value": math.nan}, "constant-nan"),
    ({"dist": "exponential", "mean": 0}, "exponential-mean-0"),
    ({"dist": "uniform", "min": 1, "max": 1e30}, "uniform-max-1e30"),
    ({"dist": "uniform", "min": 1}, "uniform-no-max"),
    ({"dist": "uniform", "min": 50, "max": 10}, "uniform-max-below-min"),
    ({"dist": "lognormal", "mean": 100, "sigma": 50}, "lognormal-sigma-50"),
    ({"dist": "normal", "mean": 100, "std": -1}, "normal-std-negative"),
    ({"dist": "zipf", "mean": 10}, "unknown-dist"),
    ({"dist": "constant", "value": 10, "mean": 3}, "unknown-key"),
    ({"dist": "constant", "value": True}, "constant-bool"),
]
LENGTH_CASES = [pytest.param(_with(workload={which: v}), [f"workload.{which}"],
                             id=f"{which}-{label}")
                for which in ("prompt_tokens", "output_tokens") for v, label in LENGTHS]


def _fault(**entry) -> dict:
    return _with(faults=[{"at_s": 1.0, "target": "gpu:0", **entry}])


FAULT_CASES = [
    pytest.param(_fault(at_s=math.nan), ["faults[0].at_s"], id="fault-at-nan"),
    pytest.param(_fault(at_s=math.inf), ["faults[0].at_s"], id="fault-at-inf"),
    pytest.param(_fault(at_s=-1.0), ["faults[0].at_s"], id="fault-at-negative"),
    pytest.param(_fault(at_s=1e30), ["faults[0].at_s"], id="fault-at-1e30"),
    pytest.param(_fault(at_s="soon"), ["faults[0].at_s"], id="fault-at-string"),
    pytest.param(_fault(duration_s=math.nan), ["faults[0].duration_s"], id="fault-dur-nan"),
    pytest.param(_fault(duration_s=math.inf), ["faults[0].duration_s"], id="fault-dur-inf"),
    pytest.param(_fault(duration_s=0.0), ["faults[0].duration_s"], id="fault-dur-zero"),
    pytest.param(_fault(duration_s=-2.0), ["faults[0].duration_s"], id="fault-dur-negative"),
    pytest.param(_fault(duration_s=1e300), ["faults[0].duration_s"], id="fault-dur-1e300"),
    pytest.param(_fault(target="cpu:0"), ["faults[0].target"], id="fault-target-kind"),
    pytest.param(_fault(target=5), ["faults[0].target"], id="fault-target-int"),
    pytest.param(_fault(target="gpu:99"), ["target 'gpu:99'", "no such GPU"],
                 id="fault-target-missing-gpu"),
    pytest.param(_fault(target="node:3"), ["target 'node:3'"], id="fault-target-missing-node"),
    pytest.param(_fault(target="link:gpu0-gpu1"), ["no link between"], id="fault-link-missing"),
    pytest.param(_fault(when=3), ["faults[0].when", "unknown key"], id="fault-unknown-key"),
    pytest.param(_with(faults=[1]), ["faults[0]", "expected a table"], id="fault-not-table"),
    pytest.param(_with(faults={"random": {"gpu_mtbf": 1.0}}), ["faults.random.gpu_mtbf"],
                 id="random-unknown-key"),
    pytest.param(_with(faults={"random": 3}), ["faults.random", "expected a table"],
                 id="random-not-table"),
]

NAME_CASES = [
    pytest.param(_with(name=n), ["name:", "plain folder name"], id=f"name-{label}")
    for n, label in [("/tmp/abs", "absolute"), ("../escape", "dotdot"), ("", "empty"),
                     ("a/b", "slash"), (".", "dot"), ("..", "dotdot-only"),
                     ("x" * 101, "too-long"), ("a\nb", "newline"), (".hidden", "hidden")]
] + [
    pytest.param(_with(name=5), ["name:", "expected str"], id="name-int"),
    pytest.param(_with(seed=-1), ["seed:"], id="seed-negative"),
    pytest.param(_with(seed=1.5), ["seed:", "expected int"], id="seed-float"),
    pytest.param(_with(seed="x"), ["seed:"], id="seed-string"),
    pytest.param(_with(sede=3), ["sede", "did you mean 'seed'"], id="top-unknown-key"),
    pytest.param(_with(parallel=4), ["parallel", "expected a table"], id="section-not-table"),
    pytest.param(_with(paralel={"tp": 2}), ["paralel", "did you mean 'parallel'"],
                 id="section-unknown"),
    pytest.param(_with(parallel={"tpp": 2}), ["parallel.tpp", "did you mean 'tp'"],
                 id="key-unknown"),
]

CROSS_CASES = [
    pytest.param(_with(workload={"num_requests": DROP, "duration_s": 1e6, "rate_per_s": 1e6}),
                 ["workload.duration_s", "requests"], id="rate-x-duration-too-many"),
    pytest.param(_with(workload={"rate_per_s": 1e-30, "num_requests": DROP,
                                 "duration_s": 10.0}), ["workload.rate_per_s"],
                 id="rate-1e-30"),
    pytest.param(_with(workload={"rate_per_s": 1e30, "num_requests": DROP,
                                 "duration_s": 10.0}), ["workload.rate_per_s"],
                 id="rate-1e30-duration-only"),
    pytest.param(_with(workload={"rate_per_s": 1e-5, "num_requests": 1000}),
                 ["workload.rate_per_s", "num_requests / rate_per_s"], id="arrivals-too-long"),
    pytest.param(_with(workload={"num_requests": DROP}), ["workload.num_requests"],
                 id="no-count-no-duration"),
    pytest.param(_with(workload={"rate_per_s": DROP}), ["workload.rate_per_s", "required"],
                 id="rate-missing"),
    pytest.param(_with(workload={"arrival": "closed_loop", "rate_per_s": DROP}),
                 ["workload.concurrency", "required"], id="concurrency-missing"),
    pytest.param(_with(workload={"arrival": "trace", "rate_per_s": DROP}),
                 ["workload.trace", "required"], id="trace-missing"),
    pytest.param(_with(workload={"arrival": "bursty"}), ["workload.arrival"],
                 id="arrival-unknown"),
    pytest.param(_with(engine={"max_num_batched_tokens": 4, "max_num_seqs": 8}),
                 ["engine.max_num_batched_tokens", ">= engine.max_num_seqs"],
                 id="budget-below-seqs"),
    pytest.param(_with(engine={"scheduler": "sarathi", "scheduler_args": {"chunk": 4}}),
                 ["engine.scheduler_args.chunk"], id="scheduler-arg-unknown"),
    pytest.param(_with(engine={"scheduler": "sarathi", "scheduler_args": {"chunk_size": 0}}),
                 ["engine.scheduler_args.chunk_size"], id="scheduler-arg-zero"),
    pytest.param(_with(engine={"scheduler_args": 3}), ["engine.scheduler_args"],
                 id="scheduler-args-not-table"),
    pytest.param(_with(engine={"block_size": 2**40}), ["engine.block_size"],
                 id="block-size-2-40"),
    pytest.param(_with(engine={"max_num_batched_tokens": 2**62}),
                 ["engine.max_num_batched_tokens"], id="budget-2-62"),
    pytest.param(_with(engine={"scheduler": "lightllm"}), ["engine.scheduler"],
                 id="scheduler-unknown"),
    pytest.param(_with(engine={"preemption": "kill"}), ["engine.preemption"],
                 id="preemption-unknown"),
    pytest.param(_with(model={"weight_dtype": "fp64"}), ["model.weight_dtype"],
                 id="dtype-unknown"),
    pytest.param(_with(model={"name": "llama-9"}), ["model.name"], id="model-unknown"),
    pytest.param(_with(cluster={"topology": "dgx-h1000"}), ["cluster.topology"],
                 id="topology-unknown"),
    pytest.param(_with(cluster={"fabric": "torus"}), ["cluster.fabric"], id="fabric-unknown"),
    pytest.param(_with(router={"policy": "fastest"}), ["router.policy"], id="router-unknown"),
    pytest.param(_with(parallel={"placement": "random"}), ["parallel.placement"],
                 id="placement-unknown"),
    pytest.param(_with(parallel={"tp": 3}), ["parallel.tp", "32 attention heads"],
                 id="tp-not-dividing"),
    pytest.param(_with(parallel={"tp": 8, "dp": 2}), ["parallel", "16 GPUs"],
                 id="layout-too-large"),
    pytest.param(_with(output={"steps": "yes"}), ["output.steps", "expected bool"],
                 id="bool-as-string"),
    pytest.param(_with(recovery={"retry": "never"}), ["recovery.retry"], id="retry-unknown"),
]

#: Trace files: (CSV bytes, words the error must hold).
TRACES = {
    "missing-columns": (b"a,b\n1,2\n", ["has: a, b"]),
    "token-negative": (b"arrival_s,prompt_tokens,output_tokens\n0,-100,10\n",
                       ["row 2, column prompt_tokens", "'-100'"]),
    "token-minus-3": (b"arrival_s,prompt_tokens,output_tokens\n0,10,10\n1,10,-3\n",
                      ["row 3, column output_tokens", "'-3'"]),
    "token-fraction": (b"arrival_s,prompt_tokens,output_tokens\n0,100.7,10\n",
                       ["row 2, column prompt_tokens", "'100.7'"]),
    "token-0.2": (b"arrival_s,prompt_tokens,output_tokens\n0,100,0.2\n",
                  ["row 2, column output_tokens", "'0.2'"]),
    "token-1e30": (b"arrival_s,prompt_tokens,output_tokens\n0,1e30,10\n",
                   ["row 2, column prompt_tokens"]),
    "token-zero": (b"arrival_s,prompt_tokens,output_tokens\n0,100,0\n",
                   ["row 2, column output_tokens"]),
    "token-text": (b"arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,abc,10\n",
                   ["row 3, column prompt_tokens", "'abc'"]),
    "token-empty": (b"arrival_s,prompt_tokens,output_tokens\n0,,10\n",
                    ["row 2, column prompt_tokens"]),
    "time-nan": (b"arrival_s,prompt_tokens,output_tokens\nnan,100,10\n",
                 ["row 2, column arrival_s"]),
    "time-text": (b"start_offset_ns,ContextTokens,GeneratedTokens\nsoon,100,10\n",
                  ["row 2, column start_offset_ns", "'soon'"]),
    "timestamp-bad": (b"TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,100,10\n",
                      ["row 2, column TIMESTAMP"]),
    "time-1e300": (b"arrival_s,prompt_tokens,output_tokens\n0,100,10\n1e300,100,10\n",
                   ["beyond"]),
    "header-only": (b"arrival_s,prompt_tokens,output_tokens\n", ["no requests"]),
    "empty-file": (b"", ["not a readable CSV"]),
    "random-bytes": (bytes(range(256)) * 8, ["not a readable CSV"]),
    "long-cell": (b"arrival_s,prompt_tokens,output_tokens\n0,100," + b"9" * 5000 + b"x\n",
                  ["row 2, column output_tokens", "..."]),
    "secret-header": (b"SECRET_TOKEN=hunter2\x00PATH=/usr/bin\x00\n", ["no plain column"]),
}
TRACE_FILES = [pytest.param(_with(workload=TRACE_WORKLOAD), ["workload.trace", *needles],
                            content, id=f"trace-{label}")
               for label, (content, needles) in TRACES.items()]
TRACE_CASES = [
    pytest.param(_with(workload={**TRACE_WORKLOAD, "trace": "nope.csv"}),
                 ["workload.trace", "not found"], id="trace-file-missing"),
    pytest.param(_with(workload={**TRACE_WORKLOAD, "trace": "."}),
                 ["workload.trace", "is not a file"], id="trace-is-directory"),
    pytest.param(_with(workload={**TRACE_WORKLOAD, "time_scale": 1e6}),
                 ["workload.time_scale", "stretches"], id="trace-time-scale-stretch"),
    pytest.param(_with(workload={**TRACE_WORKLOAD, "start_s": 100.0}),
                 ["workload", "no request arrives"], id="trace-start-after-end"),
    pytest.param(_with(workload={**TRACE_WORKLOAD, "trace": "/proc/self/environ"}),
                 ["workload.trace", "/proc/self/environ"], id="trace-proc-environ"),
]

CORPUS = [pytest.param(*p.values, GOOD_TRACE.encode(), id=p.id)
          for p in GENERATED + LENGTH_CASES + FAULT_CASES + NAME_CASES + CROSS_CASES
          + TRACE_CASES] + TRACE_FILES


def test_corpus_covers_every_kind_of_bad_input():
    assert len(CORPUS) + len(FILE_CASES) + len(CLI_CASES) >= 153
    covered = {p.values[1][0] for p in GENERATED}
    assert covered == {key for key, _, _ in NUMERIC}  # every numeric key has bad cases


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _rejected(tmp_path: Path, monkeypatch, capsys, argv: list, needles: list[str],
              source: str | None = None) -> str:
    """Run the CLI in-process from ``tmp_path``; assert exit 2, one stderr line holding
    every needle (and ``source``), no traceback, nothing written."""
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Error:" not in err.split(": ", 1)[0]
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    for needle in needles + ([source] if source else []):
        assert needle in lines[0], (needle, lines[0])
    assert _snapshot(tmp_path) == before, "something was written"
    return lines[0]


@pytest.mark.parametrize("data, needles, trace", CORPUS)
def test_bad_scenario_exits_2_with_one_line(data, needles, trace, tmp_path, monkeypatch,
                                            capsys):
    (tmp_path / "trace.csv").write_bytes(trace)
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(data))
    line = _rejected(tmp_path, monkeypatch, capsys,
                     ["run", path, "--out", tmp_path / "out", "--quiet"], needles, str(path))
    assert "hunter2" not in line and "PATH=" not in line and len(line) < 600


# -- scenario files that are not scenarios, and command-line misuse ---------------------------

FILE_CASES = [
    pytest.param(b"\xff\xfe\x00garbage\x80\x81", ["not valid TOML", "UTF-8"], id="random-bytes"),
    pytest.param(b"name = \n[model\n", ["not valid TOML", "line 1"], id="bad-toml"),
    pytest.param(b"seed = 1\nseed = 2\n", ["not valid TOML"], id="duplicate-key"),
    pytest.param(b"seed = 1" + b"\x00" * 8, ["not valid TOML"], id="nul-bytes"),
    pytest.param(None, ["directory"], id="path-is-directory"),
    pytest.param(False, ["not found"], id="path-missing"),
]


@pytest.mark.parametrize("content, needles", FILE_CASES)
def test_bad_scenario_file(content, needles, tmp_path, monkeypatch, capsys):
    path = tmp_path / "s.toml"
    if content is None:
        path.mkdir()
    elif content is not False:
        path.write_bytes(content)
    _rejected(tmp_path, monkeypatch, capsys, ["run", path, "--out", tmp_path / "out"],
              needles, str(path))


def _prepare_out(tmp_path: Path, kind: str) -> Path:
    if kind == "file":
        (tmp_path / "o").write_text("x")
        return tmp_path / "o"
    if kind == "under-file":
        (tmp_path / "f").write_text("x")
        return tmp_path / "f" / "o"
    if kind == "summary-dir":
        (tmp_path / "o" / "summary.json").mkdir(parents=True)
        return tmp_path / "o"
    if kind == "foreign":
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / "notes.txt").write_text("mine")
        return tmp_path / "o"
    if kind == "symlink":
        (tmp_path / "real").mkdir()
        (tmp_path / "o").symlink_to(tmp_path / "real")
        return tmp_path / "o"
    if kind == "proc":
        return Path("/proc/nonexistent/o")
    return Path(kind)


CLI_CASES = [
    pytest.param(["--set", "=5"], ["--set", "'=5'"], id="set-empty-key"),
    pytest.param(["--set", "parallel.tp"], ["--set", "expected section.key=value"],
                 id="set-no-equals"),
    pytest.param(["--set", "parallel..tp=2"], ["--set"], id="set-empty-part"),
    pytest.param(["--set", "parallel.tp.x=2"], ["--set", "tp is not a table"],
                 id="set-through-a-value"),
    pytest.param(["--set", "parallel=5"], ["parallel", "expected a table"],
                 id="set-section-to-value"),
    pytest.param(["--set", "parallel.tp=abc"], ["parallel.tp", "expected int"],
                 id="set-wrong-type"),
    pytest.param(["--set", "workload.rate_per_s=1e400"], ["workload.rate_per_s"],
                 id="set-overflowing-float"),
    pytest.param(["--set", "name=../x"], ["name:"], id="set-name-escape"),
    pytest.param(["--seed", "-1"], ["seed:"], id="seed-negative"),
    pytest.param(["--seed", "abc"], ["--seed", "invalid int"], id="seed-not-int"),
    pytest.param(["--bogus"], ["unrecognized arguments: --bogus"], id="unknown-flag"),
    pytest.param(["--out", "file"], ["--out", "not a folder"], id="out-is-file"),
    pytest.param(["--out", "under-file"], ["--out", "is not a folder"], id="out-under-file"),
    pytest.param(["--out", "summary-dir"], ["--out", "'summary.json'", "not a run's files"],
                 id="out-summary-is-directory"),
    pytest.param(["--out", "foreign"], ["--out", "'notes.txt'"], id="out-foreign-files"),
    pytest.param(["--out", "symlink"], ["--out", "symbolic link"], id="out-symlink"),
    pytest.param(["--out", "proc"], ["--out", "cannot write"], id="out-unwritable"),
    pytest.param(["--out", "."], ["--out", "a folder of its own"], id="out-dot"),
]


@pytest.mark.parametrize("extra, needles", CLI_CASES)
def test_bad_command_line(extra, needles, tmp_path, monkeypatch, capsys):
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(BASE))
    if extra[0] == "--out":
        extra = ["--out", _prepare_out(tmp_path, extra[1])]
    else:
        extra = [*extra, "--out", tmp_path / "out"]
    _rejected(tmp_path, monkeypatch, capsys, ["run", path, "--quiet", *extra], needles)


def test_missing_subcommand_is_one_line(tmp_path, monkeypatch, capsys):
    _rejected(tmp_path, monkeypatch, capsys, [], ["required: command"])


# -- hypothesis: any value outside a key's range -------------------------------------------

@st.composite
def _out_of_range(draw):
    key, _, typ = draw(st.sampled_from(NUMERIC))
    b = key_bounds(key)
    sides = []
    if "max" in b:
        sides.append(st.integers(int(b["max"]) + 1, 2**63 - 1) if typ is int else
                     st.floats(b["max"], 1e308, exclude_min=True))
    lo = max(b.get("min", -math.inf), b.get("gt", -math.inf))
    if typ is int:
        sides.append(st.integers(-(2**63), math.ceil(lo) - 1 if "min" in b else int(lo)))
    elif "gt" in b and b.get("min", -math.inf) <= b["gt"]:
        sides.append(st.floats(-1e308, b["gt"]))
    else:
        sides.append(st.floats(-1e308, lo, exclude_max=True))
    return key, draw(st.one_of(sides))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_out_of_range())
def test_any_value_outside_a_range_is_refused(case, tmp_path_factory, capsys):
    key, value = case
    tmp = tmp_path_factory.mktemp("h")
    (tmp / "trace.csv").write_text(GOOD_TRACE)
    path = tmp / "s.toml"
    path.write_text(tomli_w.dumps(_place(_base_for(key), key, value)))
    code = main(["run", str(path), "--out", str(tmp / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"{key}: must be" in lines[0], lines
    assert not (tmp / "out").exists()


# -- the real entry point ------------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["run", "{dir}"], "directory"),
    (["run", "{dir}/s.toml", "--set", "=5"], "--set"),
    (["run", "{dir}/s.toml", "--out", "{dir}/s.toml"], "not a folder"),
], ids=["scenario-is-directory", "set-empty-key", "out-is-a-file"])
def test_real_process_exits_2_with_one_line(argv, needle, tmp_path):
    (tmp_path / "s.toml").write_text(tomli_w.dumps(BASE))
    argv = [a.format(dir=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "simulator", *argv], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "runs").exists()


def test_a_node_without_gpus_names_the_field(tmp_path, monkeypatch, capsys):
    data = Path(__file__).parent / "data"
    node = (data / "toy_node.toml").read_text()
    node = "\n".join("gpus_per_node = 0" if line.startswith("gpus_per_node") else line
                     for line in node.splitlines())
    (tmp_path / "node.toml").write_text(node.replace('"toy_gpu.toml"',
                                                     repr(str(data / "toy_gpu.toml"))))
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(_with(cluster={"topology": "node.toml"})))
    _rejected(tmp_path, monkeypatch, capsys, ["run", path, "--out", tmp_path / "out"],
              ["cluster.topology", "gpus_per_node must be in [1, 1024], got 0"], str(path))
