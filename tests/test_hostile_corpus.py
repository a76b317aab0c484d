"""The hostile-input corpus: one row per case, for every command and every reader.

Each row names a command line, the files it finds in a fresh folder, the exit status it
must give and words its one line on stderr must hold. Files are written from the row: a
``str`` or ``bytes`` as it is, a ``dict`` as TOML (``.toml``) or JSON (anything else), a
:class:`Link` as a symbolic link. ``{d}`` in the command is the folder. Every row must
also leave no traceback, print one line to stderr, and leave every file it was given
unchanged (nothing read is modified, nothing is written through a link). New features add
rows here.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomli_w
from conftest import DATA, toy_scenario

from simulator.cli import main


@dataclass(frozen=True)
class Link:
    """A symbolic link to ``target`` (``{d}`` is the folder)."""

    target: str


@dataclass(frozen=True)
class Case:
    id: str
    argv: str | list[str]
    files: dict = field(default_factory=dict)
    words: tuple[str, ...] = ()
    rc: int = 2
    absent: tuple[str, ...] = ()  # words the message must not hold (a leaked value)
    run: bool = False  # start from a copy of a real run folder at {d}/r
    unwritten: tuple[str, ...] = ()  # paths (under {d}) that must not exist afterwards


TOY = toy_scenario(workload={"arrival": "constant", "rate_per_s": 10.0, "num_requests": 4,
                             "prompt_tokens": 100, "output_tokens": 3})
MOE = json.loads((Path(__file__).parents[1] / "simulator/model/configs/qwen3-30b-a3b.json"
                  ).read_text())
SECRET = "s3cr3t-VALUE-that-must-never-show-up-anywhere-0123456789"


def sc(**sections) -> dict:
    """The toy scenario with ``sections`` merged in (a None value drops the key)."""
    data = copy.deepcopy(TOY)
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(data.get(name), dict):
            data[name] = {k: v for k, v in {**data[name], **values}.items() if v is not None}
        else:
            data[name] = values
    return data


def moe(**fields) -> dict:
    return {**MOE, **fields}


def mooncake(*rows: dict) -> str:
    good = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}
    return "".join(json.dumps({**good, **r}) + "\n" for r in rows)


def on_moe(config: str = "m.json", **model) -> dict:
    return sc(model={"name": config, **model})


MOONCAKE_WL = {"arrival": "trace", "trace": "t.jsonl", "rate_per_s": None,
               "num_requests": None, "prompt_tokens": None, "output_tokens": None}
CSV_WL = {**MOONCAKE_WL, "trace": "t.csv"}

GRID = '"engine.max_num_seqs" = [8, 16]\n'
CAL = DATA.parent.parent / "simulator" / "calibration" / "data" / "h100_sxm"
NCCL = (CAL / "nccl.csv").read_text()
GEMM = (CAL / "gemm.csv").read_text()


def nccl_with(row: str) -> str:
    head, first, *_ = NCCL.splitlines()
    return f"{head}\n{first}\n{row}\n"


def gemm_with(**cells) -> str:
    head, first, *_ = GEMM.splitlines()
    cols, vals = head.split(","), first.split(",")
    bad = ",".join(str(cells.get(c, v)) for c, v in zip(cols, vals, strict=True))
    return f"{head}\n{first}\n{bad}\n"


def pool(**keys) -> dict:
    return sc(pools=[{"name": "p", "role": "mixed", "nodes": 1, "tp": 1, "dp": 1, **keys}])


CASES = [
    # -- the scenario file ------------------------------------------------------------------
    Case("scenario-deep-toml", "validate {d}/s.toml",
         {"s.toml": "a = " + "[" * 5000 + "]" * 5000 + "\n"}, ("s.toml", "deeper than 32")),
    Case("scenario-deep-tables", "validate {d}/s.toml",
         {"s.toml": "[" + ".".join(["a"] * 40) + "]\nx = 1\n"}, ("s.toml", "deeper than 32")),
    Case("scenario-dev-zero", "validate {d}/s.toml", {"s.toml": Link("/dev/zero")},
         ("s.toml", "not a regular file")),
    Case("set-deep", ["validate", "{d}/s.toml", "--set", "engine.x=" + "[" * 5000 + "]" * 5000],
         {"s.toml": TOY}, ("--set engine.x", "deeper than 32")),
    Case("grid-deep", "sweep {d}/s.toml --grid {d}/g.toml --out {d}/o.csv",
         {"s.toml": TOY, "g.toml": "a = " + "[" * 5000 + "]" * 5000},
         ("g.toml", "deeper than 32"), unwritten=("o.csv",)),
    Case("scenario-huge", "validate {d}/s.toml", {"s.toml": "#" * (17 * 2**20)},
         ("s.toml", "bytes, above")),
    # -- model config.json ------------------------------------------------------------------
    Case("config-deep-json", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": "[" * 100000 + "]" * 100000},
         ("model.name", "m.json", "deeper than 32")),
    Case("config-dev-zero", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": Link("/dev/zero")}, ("model.name", "not a regular")),
    Case("config-experts-1e308", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(num_experts=1e308)},
         ("num_experts", "[1, 4096]")),
    Case("config-layers-1e9", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(num_hidden_layers=10**9)},
         ("num_hidden_layers", "[1, 1024]")),
    Case("config-experts-zero", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(num_experts=0)}, ("num_experts", "0")),
    Case("config-long-string", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(hidden_size=SECRET)}, ("hidden_size",),
         absent=(SECRET[20:],)),
    Case("config-quant-string", "validate {d}/s.toml",
         {"s.toml": on_moe(), "m.json": moe(quantization_config={"quant_method": SECRET})},
         ("quant_method",), absent=(SECRET[20:],)),
    # -- node and GPU files -----------------------------------------------------------------
    Case("node-dev-zero", "validate {d}/s.toml",
         {"s.toml": sc(cluster={"topology": "n.toml"}), "n.toml": Link("/dev/zero")},
         ("cluster.topology", "not a regular file")),
    Case("node-deep", "validate {d}/s.toml",
         {"s.toml": sc(cluster={"topology": "n.toml"}),
          "n.toml": "a = " + "[" * 40 + "]" * 40}, ("cluster.topology", "deeper than 32")),
    Case("gpu-long-string", "validate {d}/s.toml",
         {"s.toml": sc(cluster={"topology": "n.toml"}),
          "n.toml": (DATA / "toy_node.toml").read_text().replace(
              'gpu = "toy_gpu.toml"', 'gpu = "g.toml"'),
          "g.toml": (DATA / "toy_gpu.toml").read_text().replace(
              "memory_bytes =", f'memory_bytes = "{SECRET}"\nx_memory_bytes =')},
         ("memory_bytes",), absent=(SECRET[20:],)),
    # -- routing weights file ---------------------------------------------------------------
    # -- Mooncake traces --------------------------------------------------------------------
    Case("mooncake-binary", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": b"\x89PNG\r\n\x1a\n\xff\xfe\x00"},
         ("t.jsonl", "line 1", "UTF-8")),
    Case("mooncake-scalar-hashes", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": mooncake({"hash_ids": 7})},
         ("line 1", "hash_ids")),
    Case("mooncake-nested-hashes", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": mooncake({"hash_ids": [[1], [2]]})},
         ("line 1", "hash_ids")),
    Case("mooncake-deep", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": "[" * 100000 + "]" * 100000},
         ("line 1", "deeper than 32")),
    *[Case(f"mooncake-{col}-{label}", "validate {d}/s.toml",
           {"s.toml": sc(workload=MOONCAKE_WL),
            "t.jsonl": mooncake({}, {col: v, "hash_ids": [1, 2]})},
           ("t.jsonl", "line 2", col, "[1, 16777216]"))
      for col in ("input_length", "output_length")
      for label, v in (("negative", -5), ("zero", 0), ("fraction", 600.5), ("bool", True),
                       ("huge", 2**24 + 1), ("overflow", 10**30), ("string", SECRET))],
    *[Case(f"mooncake-timestamp-{label}", "validate {d}/s.toml",
           {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": mooncake({}, {"timestamp": v})},
           ("t.jsonl", "line 2", "timestamp"))
      for label, v in (("nan", math.nan), ("inf", math.inf), ("1e300", 1e300),
                       ("negative", -1), ("string", "soon"), ("bool", False))],
    # -- CSV traces -------------------------------------------------------------------------
    *[Case(f"csv-timestamp-{label}", "validate {d}/s.toml",
           {"s.toml": sc(workload=CSV_WL),
            "t.csv": f"arrival_s,prompt_tokens,output_tokens\n0,100,10\n{v},100,10\n"},
           ("t.csv", "row 3", "arrival_s"))
      for label, v in (("nan", "NaN"), ("inf", "Infinity"), ("1e300", "1e300"))],
    Case("csv-dev-zero", "validate {d}/s.toml",
         {"s.toml": sc(workload=CSV_WL), "t.csv": Link("/dev/zero")},
         ("t.csv", "not a regular file")),
    # -- routing weights file ---------------------------------------------------------------
    Case("weights-environ", "validate {d}/s.toml",
         {"s.toml": on_moe(routing={"weights_file": "w.txt"}),
          "m.json": MOE, "w.txt": f"{SECRET}=1\nHOME=/root\n"},
         ("weights_file", "value 1 is not a number"), absent=(SECRET[:8],)),
    Case("weights-dev-zero", "validate {d}/s.toml",
         {"s.toml": on_moe(routing={"weights_file": "w.txt"}),
          "m.json": MOE, "w.txt": Link("/dev/zero")}, ("weights_file", "not a regular")),
    # -- pools --------------------------------------------------------------------------------
    *[Case(f"pool-name-{label}", "validate {d}/s.toml", {"s.toml": pool(name=name)},
           ("pools[0].name", "plain name"))
      for label, name in (("comma", "a,b"), ("newline", "a\nb"), ("quote", 'a"b'),
                          ("dollar", "$x$"), ("empty", ""))],
    Case("pool-scheduler-args-unknown", "validate {d}/s.toml",
         {"s.toml": pool(engine={"scheduler_args": {"bogus": 3}})},
         ("pools[0].engine.scheduler_args.bogus", "does not take")),
    Case("pool-scheduler-args-string", "validate {d}/s.toml",
         {"s.toml": pool(engine={"scheduler": "sarathi", "scheduler_args": {"chunk_size": "x"}})},
         ("pools[0].engine.scheduler_args.chunk_size", "integer")),
    Case("pool-budget-below-seqs", "validate {d}/s.toml",
         {"s.toml": pool(engine={"max_num_seqs": 64, "max_num_batched_tokens": 32})},
         ("pools[0].engine.max_num_batched_tokens", ">= pools[0].engine.max_num_seqs")),
    # -- sessions -------------------------------------------------------------------------------
    Case("sessions-2-24-turns", "validate {d}/s.toml",
         {"s.toml": sc(workload={"arrival": "sessions", "rate_per_s": 1.0, "num_requests": 2,
                                 "turns": 2**24, "prompt_tokens": 10, "output_tokens": 2})},
         ("workload.turns", "10000000")),
    Case("sessions-context-overflow", "validate {d}/s.toml",
         {"s.toml": sc(workload={"arrival": "sessions", "rate_per_s": 1.0, "num_requests": 1,
                                 "turns": 5000, "prompt_tokens": 10000, "output_tokens": 2})},
         ("workload.turns", "16777216 tokens")),
    # -- speculative decoding ---------------------------------------------------------------
    Case("draft-does-not-fit", "validate {d}/s.toml",
         {"s.toml": sc(model={"name": "llama-3.1-8b"}, cluster={"topology": "dgx-h100"},
                       speculative={"method": "draft_model", "draft_model": "llama-3.1-70b",
                                    "num_speculative_tokens": 2, "acceptance": 0.7})},
         ("speculative.draft_model", "drafter's weights"), absent=("reserve",)),
    # -- run ------------------------------------------------------------------------------------
    Case("run-pool-name-comma", "run {d}/s.toml --out {d}/o --quiet",
         {"s.toml": pool(name="a,b")}, ("pools[0].name", "plain name"), unwritten=("o",)),
    Case("run-out-link", "run {d}/s.toml --out {d}/o --quiet",
         {"s.toml": TOY, "elsewhere/x": "x", "o": Link("{d}/elsewhere")},
         ("--out", "symbolic link")),
    Case("run-out-file", "run {d}/s.toml --out {d}/o --quiet", {"s.toml": TOY, "o": "a file"},
         ("--out", "not a folder")),
    Case("run-mooncake-overflow", "run {d}/s.toml --out {d}/o --quiet",
         {"s.toml": sc(workload=MOONCAKE_WL),
          "t.jsonl": mooncake({"input_length": 2**70, "hash_ids": [1]})},
         ("line 1", "input_length", "[1, 16777216]"), absent=("-9223372036854775808",),
         unwritten=("o",)),
    # -- sweep ----------------------------------------------------------------------------------
    Case("sweep-seeds-1e9", "sweep {d}/s.toml --grid {d}/g.toml --seeds 1000000000 "
         "--out {d}/o.csv", {"s.toml": TOY, "g.toml": GRID}, ("--seeds", "100000"),
         unwritten=("o.csv",)),
    Case("sweep-grid-1e6", "sweep {d}/s.toml --grid {d}/g.toml --out {d}/o.csv",
         {"s.toml": TOY, "g.toml": {"engine.max_num_seqs": list(range(1, 1001)),
                                    "engine.max_num_batched_tokens": list(range(2048, 3048))}},
         ("1000000 runs", "100000"), unwritten=("o.csv",)),
    Case("sweep-jobs-huge", "sweep {d}/s.toml --grid {d}/g.toml --jobs 100000 "
         "--out {d}/o.csv", {"s.toml": TOY, "g.toml": GRID}, ("--jobs", "1024")),
    Case("sweep-out-link", "sweep {d}/s.toml --grid {d}/g.toml --out {d}/o.csv",
         {"s.toml": TOY, "g.toml": GRID, "victim.csv": "run_id,x\n1,2\n",
          "o.csv": Link("{d}/victim.csv")}, ("--out", "symbolic link")),
    Case("sweep-out-folder", "sweep {d}/s.toml --grid {d}/g.toml --out {d}",
         {"s.toml": TOY, "g.toml": GRID}, ("--out", "folder")),
    Case("sweep-out-parent-file", "sweep {d}/s.toml --grid {d}/g.toml --out {d}/f/o.csv",
         {"s.toml": TOY, "g.toml": GRID, "f": "a file"}, ("--out", "parent")),
    Case("sweep-resume-user-csv", "sweep {d}/s.toml --grid {d}/g.toml --out {d}/o.csv",
         {"s.toml": TOY, "g.toml": GRID, "o.csv": "a,b\n1,2\n3"}, ("--out", "header")),
    Case("sweep-grid-dev-zero", "sweep {d}/s.toml --grid {d}/g.toml --out {d}/o.csv",
         {"s.toml": TOY, "g.toml": Link("/dev/zero")}, ("g.toml", "not a regular file")),
    # -- plan and capacity ----------------------------------------------------------------
    Case("plan-nodes-empty", ["plan", "{d}/s.toml", "--nodes", "", "--out", "{d}/p"],
         {"s.toml": TOY}, ("--nodes", "empty node kind"), unwritten=("p",)),
    Case("plan-nodes-gpus-0", "plan {d}/s.toml --nodes dgx-h100 --gpus 0 --out {d}/p",
         {"s.toml": TOY}, ("--gpus", "at least 1"), absent=("cluster.nodes",)),
    *[Case(f"plan-jobs-{j}", f"plan {{d}}/s.toml --jobs {j} --out {{d}}/p", {"s.toml": TOY},
           ("--jobs", "at least 1")) for j in ("0", "-3")],
    Case("plan-quantile-nan", "plan {d}/s.toml --slo-quantile nan", {"s.toml": TOY},
         ("--slo-quantile", "finite")),
    Case("plan-out-link", "plan {d}/s.toml --out {d}/p",
         {"s.toml": TOY, "elsewhere/x": "x", "p": Link("{d}/elsewhere")},
         ("--out", "symbolic link")),
    Case("plan-out-file", "plan {d}/s.toml --out {d}/p", {"s.toml": TOY, "p": "a file"},
         ("--out", "not a folder")),
    Case("capacity-tolerance-inf", "capacity {d}/s.toml --tolerance inf", {"s.toml": TOY},
         ("--tolerance", "finite")),
    # -- topology and collective ----------------------------------------------------------
    Case("topology-nodes-1e6", "topology show dgx-h100 --nodes 1000000", {},
         ("--nodes", "4096")),
    *[Case(f"topology-oversubscription-{v}", f"topology show dgx-h100 --oversubscription {v}",
           {}, ("--oversubscription", "finite")) for v in ("nan", "inf", "-1")],
    Case("topology-png-link", "topology show dgx-h100 --png {d}/t.png",
         {"victim.png": "precious", "t.png": Link("{d}/victim.png")}, ("--png", "symbolic")),
    Case("topology-png-folder", "topology show dgx-h100 --png {d}", {}, ("--png", "folder")),
    Case("topology-dev-zero", "topology show {d}/n.toml", {"n.toml": Link("/dev/zero")},
         ("n.toml", "not a regular file")),
    Case("collective-gpus-huge", "collective --gpus 0-1000000000000", {}, ("--gpus", "GPU 8")),
    Case("collective-concurrent-huge", "collective --gpus 0-1 --concurrent 100000000", {},
         ("--concurrent", "65536")),
    Case("collective-concurrent-above-gpus", "collective --gpus 0-1 --concurrent 60000", {},
         ("--concurrent", "60000", "GPUs")),
    Case("collective-bytes-1e308", "collective --gpus 0-7 --bytes 1e308TiB", {},
         ("--bytes", "1 PiB")),
    *[Case(f"collective-oversubscription-{v}", f"collective --gpus 0-7 --oversubscription {v}",
           {}, ("--oversubscription", "finite")) for v in ("nan", "inf", "0")],
    Case("collective-nodes-1e6", "collective --gpus 0-7 --nodes 1000000", {},
         ("--nodes", "4096")),
    # -- report, compare, plot on run folders ---------------------------------------------
    Case("report-not-a-folder", "report {d}/s.toml", {"s.toml": TOY}, ("not a run folder",)),
    Case("report-empty-folder", "report {d}/e", {"e/x": "x"}, ("not a run folder",)),
    Case("report-cut-summary", "report {d}/r", {"r/summary.json": '{"requests_total": 3'},
         ("summary.json", "not valid JSON"), run=True, unwritten=("r/report.html",)),
    Case("report-summary-list", "report {d}/r", {"r/summary.json": "[1, 2]"},
         ("summary.json", "JSON object"), run=True),
    Case("report-summary-deep", "report {d}/r", {"r/summary.json": "[" * 50000 + "]" * 50000},
         ("summary.json", "deeper than 32"), run=True),
    Case("report-summary-dev-zero", "report {d}/r", {"r/summary.json": Link("/dev/zero")},
         ("summary.json", "not a regular file"), run=True),
    Case("report-requests-empty", "report {d}/r", {"r/requests.csv": ""},
         ("requests.csv", "empty"), run=True),
    Case("report-requests-wrong-columns", "report {d}/r", {"r/requests.csv": "a,b\n1,2\n"},
         ("requests.csv", "ttft_s"), run=True),
    Case("report-requests-text", "report {d}/r",
         {"r/requests.csv": "ttft_s,tpot_s,e2e_s\nx,y,z\n"},
         ("requests.csv", "non-numeric"), run=True),
    Case("report-requests-binary", "report {d}/r", {"r/requests.csv": b"\xff\xfe\x00\x01"},
         ("requests.csv",), run=True),
    Case("report-steps-wrong", "report {d}/r", {"r/steps.csv": "a\n1\n"},
         ("steps.csv", "start_s"), run=True),
    Case("report-scenario-dev-zero", "report {d}/r", {"r/scenario.toml": Link("/dev/zero")},
         ("scenario.toml", "not a regular file"), run=True),
    Case("report-html-link", "report {d}/r",
         {"victim.html": "precious", "r/report.html": Link("{d}/victim.html")},
         ("report.html", "symbolic link"), run=True),
    Case("compare-foreign", "compare {d}/r {d}/e --out {d}/c", {"e/requests.csv": "a\n1\n",
                                                                "e/summary.json": "{}"},
         ("requests.csv", "ttft_s"), run=True, unwritten=("c",)),
    Case("compare-out-file", "compare {d}/r {d}/r --out {d}/c", {"c": "a file"},
         ("--out", "not a folder"), run=True),
    Case("compare-out-link", "compare {d}/r {d}/r --out {d}/c",
         {"elsewhere/compare.csv": "precious", "c": Link("{d}/elsewhere")},
         ("--out", "symbolic link"), run=True),
    Case("plot-png-link", "plot {d}/r",
         {"victim.png": "precious", "r/latency_cdf.png": Link("{d}/victim.png")},
         ("latency_cdf.png", "symbolic link"), run=True),
    Case("plot-out-file", "plot {d}/r --out {d}/f", {"f": "a file"}, ("--out", "not a folder"),
         run=True),
    Case("plot-sweep-csv-empty", "plot {d}/w.csv --x a --y b", {"w.csv": ""}, ("w.csv", "empty")),
    Case("plot-sweep-y-text", "plot {d}/w.csv --x a --y b",
         {"w.csv": "run_id,a,seed,status,error,b\n1,x,0,ok,,hello\n"}, ("--y", "not numeric")),
    Case("mooncake-environ", "validate {d}/s.toml",
         {"s.toml": sc(workload=MOONCAKE_WL), "t.jsonl": f"{SECRET}=1\0HOME=/root\0"},
         ("line 1", "is not valid JSON"), absent=(SECRET[:8],)),
    Case("plot-sweep-csv-dev-zero", "plot {d}/w.csv --x a --y b", {"w.csv": Link("/dev/zero")},
         ("w.csv", "not a regular file")),
    # -- calibrate ------------------------------------------------------------------------------
    *[Case(f"calibrate-nccl-{n}-gpus", "calibrate check --gpu h100_sxm --data {d}/c",
           {"c/nccl.csv": nccl_with(f"all_gather,half,{n},512,5.5")},
           ("nccl.csv", "num_gpus", ">= 2")) for n in (0, 1)],
    Case("calibrate-fit-inf-latency", "calibrate fit --gpu h100_sxm --data {d}/c --out {d}/g.toml",
         {"c/gemm.csv": gemm_with(latency_us="inf")}, ("gemm.csv", "latency_us", "finite"),
         unwritten=("g.toml",)),
    Case("calibrate-fit-m-zero", "calibrate fit --gpu h100_sxm --data {d}/c --out {d}/g.toml",
         {"c/gemm.csv": gemm_with(m=0)}, ("gemm.csv", "column m", "> 0"),
         unwritten=("g.toml",)),
    Case("calibrate-csv-dev-zero", "calibrate check --gpu h100_sxm --data {d}/c",
         {"c/gemm.csv": Link("/dev/zero")}, ("gemm.csv", "not a regular file")),
    Case("calibrate-out-folder", "calibrate check --gpu h100_sxm --data {d}/c --out {d}/c",
         {"c/gemm.csv": GEMM}, ("--out", "folder")),
    Case("calibrate-fit-out-link", "calibrate fit --gpu h100_sxm --data {d}/c --out {d}/g.toml",
         {"c/gemm.csv": gemm_with(), "victim": "precious", "g.toml": Link("{d}/victim")},
         ("--out", "symbolic link")),
]


def _write(folder: Path, files: dict) -> dict[Path, bytes | None]:
    kept = {}
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a run folder's file replaced by the row's
        if isinstance(content, Link):
            path.symlink_to(content.target.format(d=folder))
            kept[path] = None
            continue
        if isinstance(content, dict):
            content = (tomli_w.dumps(content) if name.endswith(".toml")
                       else json.dumps(content))
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        kept[path] = path.read_bytes()
    return kept


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """One real run's folder (the toy scenario)."""
    folder = tmp_path_factory.mktemp("run")
    (folder / "s.toml").write_text(tomli_w.dumps(TOY))
    assert main(["run", str(folder / "s.toml"), "--out", str(folder / "r"), "--quiet"]) == 0
    return folder / "r"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, monkeypatch, capsys, request):
    if case.run:
        shutil.copytree(request.getfixturevalue("run_folder"), tmp_path / "r")
    kept = _write(tmp_path, case.files)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    words = case.argv.split() if isinstance(case.argv, str) else case.argv
    argv = [a.format(d=tmp_path) for a in words]
    assert main(argv) == case.rc
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    if case.rc == 2:
        assert len(lines) == 1, err
    for word in case.words:
        assert word in err, (word, err)
    for word in case.absent:
        assert word not in err, (word, err)
    for path, before in kept.items():  # nothing read was changed or written through
        if before is None:
            assert path.is_symlink()
        else:
            assert path.read_bytes() == before, path
    for name in case.unwritten:
        assert not (tmp_path / name).exists(), name
    assert not (tmp_path / "runs").exists()  # no default output folder either
