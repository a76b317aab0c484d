"""Launch commands: every flag emitted is one the engine's argument parser declares (the
lists in tests/data/engine_flags/, with the engine version and source file), and each
command parses back into the scenario's layout and engine limits by a parser written here
from the engines' semantics, not from the emitter."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.io.scenario import load_scenario
from simulator.planner.launch import ENGINES, launch, model_id
from simulator.planner.report import LAUNCH, write_launch

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ROOT / "tests" / "data" / "engine_flags"


def flag_list(engine: str) -> tuple[dict[str, bool], set[str]]:
    """``{flag: takes a value}`` and the YAML keys of one engine's list."""
    flags, keys = {}, set()
    for line in (FLAGS / f"{engine}.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        a, b = line.split()
        if a == "yaml":
            keys.add(b)
        else:
            flags[a] = b == "VALUE"
    return flags, keys


def parse(argv: list[str], flags: dict[str, bool]) -> dict[str, str | bool]:
    """The options of a command, each checked against the engine's flag list."""
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        assert a in flags, f"{a} is not a flag of the engine's parser"
        if flags[a]:
            out[a] = argv[i + 1]
            i += 2
        else:
            out[a] = True
            i += 1
    return out


def layout(engine: str, argv: list[str], extra: dict) -> dict:
    """(tp, pp, ep, attention_dp, max_num_seqs, budget, chunked, role) of one replica."""
    flags, _ = flag_list(engine)
    if engine == "vllm":
        assert argv[:2] == ["vllm", "serve"]
        d = parse(argv[3:], flags)
        dp = int(d.get("--data-parallel-size", 1))  # emitted only for attention DP
        tp = dp if dp > 1 else int(d["--tensor-parallel-size"])
        assert dp == 1 or int(d["--tensor-parallel-size"]) == 1
        return {"tp": tp, "pp": int(d["--pipeline-parallel-size"]),
                "ep": tp if d.get("--enable-expert-parallel") else 1,
                "attention_dp": dp > 1,
                # per DP rank: the replica's limit split over its ranks, rounded up
                "max_num_seqs": (int(d["--max-num-seqs"]), dp),
                "budget": (int(d["--max-num-batched-tokens"]), dp),
                "chunked": bool(d.get("--enable-chunked-prefill")),
                "role": "mixed" if "--kv-transfer-config" not in d else "pd",
                "prefix": bool(d.get("--enable-prefix-caching"))}
    if engine == "sglang":
        assert argv[:3] == ["python", "-m", "sglang.launch_server"]
        d = parse(argv[3:], flags)
        tp = int(d["--tp-size"])
        adp = bool(d.get("--enable-dp-attention"))
        assert not adp or int(d["--dp-size"]) == tp
        return {"tp": tp, "pp": int(d["--pp-size"]), "ep": int(d.get("--ep-size", 1)),
                "attention_dp": adp, "max_num_seqs": (int(d["--max-running-requests"]), 1),
                "budget": (int(d["--max-prefill-tokens"]), 1),
                "chunked": int(d["--chunked-prefill-size"]) != -1,
                "role": "mixed" if "--disaggregation-mode" not in d else "pd",
                "prefix": not d.get("--disable-radix-cache")}
    assert argv[0] == "trtllm-serve"
    d = parse(argv[2:], flags)
    return {"tp": int(d["--tp_size"]), "pp": int(d["--pp_size"]),
            "ep": int(d.get("--ep_size", 1)),
            "attention_dp": bool(extra.get("enable_attention_dp", False)),
            "max_num_seqs": (int(d["--max_batch_size"]), 1),
            "budget": (int(d["--max_num_tokens"]), 1),
            "chunked": bool(d.get("--enable_chunked_prefill")), "role": None,
            "prefix": extra["kv_cache_config"]["enable_block_reuse"]}


CASES = [
    ("workloads/plan-70b-1xdgx.toml", ["parallel.tp=4", "parallel.dp=2"]),
    ("workloads/plan-70b-1xdgx.toml", ["parallel.tp=2", "parallel.pp=2",
                                       "engine.scheduler=vllm_v0",
                                       "engine.prefix_caching=false"]),
    ("workloads/moe-deepseek-v3-2xh200.toml", []),
    ("workloads/spec-deepseek-v3-mtp.toml", []),
    ("workloads/disagg-70b-1p1d.toml", []),
]


def expected(s) -> list[dict]:
    """The replica shapes as the scenario states them."""
    e = s.engine
    rows = ([("mixed", s.parallel, e)] if not s.pools
            else [(q.role, q, e) for q in s.pools])
    out = []
    for role, p, eng in rows:
        out.append({"tp": p.tp, "pp": p.pp, "ep": p.ep, "attention_dp": p.attention_dp,
                    "max_num_seqs": eng.max_num_seqs, "budget": eng.max_num_batched_tokens,
                    "chunked": eng.scheduler in ("vllm", "sarathi"),
                    "role": "mixed" if role == "mixed" else "pd",
                    "prefix": eng.prefix_caching, "dp": p.dp})
    return out


@pytest.mark.parametrize("path, sets", CASES)
def test_commands_parse_back_into_the_layout(path, sets):
    s = load_scenario(ROOT / path, overrides=sets)
    found = launch(s)
    want = expected(s)
    for engine in ENGINES:
        assert len(found.commands[engine]) == len(want)
        for i, (argv, w) in enumerate(zip(found.commands[engine], want, strict=True)):
            got = layout(engine, argv, found.extra[i])
            for k in ("tp", "pp", "ep", "attention_dp", "chunked", "prefix"):
                assert got[k] == w[k], (engine, k)
            if got["role"] is not None:
                assert got["role"] == w["role"]
            for k in ("max_num_seqs", "budget"):
                per_rank, ranks = got[k]
                assert per_rank == -(-w[k] // ranks), (engine, k)
            assert found.servers[i].replicas == w["dp"]
            # the shell line is the same argv
            assert shlex.split(found.text(engine).splitlines()[2 * i + 1]) == argv
        _, keys = flag_list("trtllm")
        for extra in found.extra:
            for k, v in extra.items():
                assert k in keys
                for sub in v if isinstance(v, dict) else ():
                    assert f"{k}.{sub}" in keys


def test_precision_speculation_and_pools_map_to_the_engines_flags():
    s = load_scenario(ROOT / "workloads/spec-deepseek-v3-mtp.toml")
    f = launch(s)
    vllm, sgl = f.commands["vllm"][0], f.commands["sglang"][0]
    assert vllm[vllm.index("--quantization") + 1] == "fp8"
    assert '"method":"deepseek_mtp","num_speculative_tokens":1' in \
        vllm[vllm.index("--speculative-config") + 1]
    assert sgl[sgl.index("--speculative-algorithm") + 1] == "NEXTN"
    assert sgl[sgl.index("--speculative-num-draft-tokens") + 1] == "2"  # k + 1
    assert f.extra[0]["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": 1}
    d = launch(load_scenario(ROOT / "workloads/disagg-70b-1p1d.toml"))
    modes = [a[a.index("--disaggregation-mode") + 1] for a in d.commands["sglang"]]
    assert modes == ["prefill", "decode"]
    assert model_id("llama-3.1-70b") == "meta-llama/Llama-3.1-70B"
    assert model_id("deepseek-v3") == "deepseek-ai/DeepSeek-V3"


def test_write_launch_files_are_valid(tmp_path):
    s = load_scenario(ROOT / "workloads/disagg-70b-1p1d.toml")
    files = write_launch(s, tmp_path)
    assert files[0].name == LAUNCH
    text = files[0].read_text()
    assert text.count("vllm serve ") == 2 and text.count("trtllm-serve ") == 2
    options = [f for f in files if f.name in ("prefill-0.yaml", "decode-1.yaml")]
    assert len(options) == 2  # TensorRT-LLM's option file of each pool
    for f in options:
        assert yaml.safe_load(f.read_text())["kv_cache_config"]["enable_block_reuse"] is True


def test_plan_emits_a_row(tmp_path, capsys):
    import tomli_w

    from tests.test_planner import SMALL

    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(SMALL))
    out = tmp_path / "o"
    assert main(["plan", str(path), "--gpus", "2", "--top", "2", "--jobs", "1",
                 "--colocated-only", "--no-plot", "--emit", "2", "--out", str(out)]) == 0
    assert (out / LAUNCH).exists() and (out / "launch-rank2" / LAUNCH).exists()
    assert main(["plan", str(path), "--gpus", "2", "--top", "1", "--jobs", "1",
                 "--colocated-only", "--no-plot", "--emit", "99", "--out", str(out)]) == 2
    assert "--emit: no rank 99" in capsys.readouterr().err


def test_worked_deploy_and_side_by_side_match_the_doc(tmp_path, capsys):
    """docs/planner.md quotes this plan's agg/disagg line and its launch.sh commands."""
    doc = (ROOT / "docs" / "planner.md").read_text()
    out = tmp_path / "o"
    assert main(["plan", str(ROOT / "workloads/plan-70b-1xdgx.toml"), "--requests", "200",
                 "--top", "3", "--no-plot", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("  agg/disagg "))
    assert line in doc and "colocated ahead by 50%" in line
    commands = [x for x in (out / LAUNCH).read_text().splitlines()
                if x.startswith(("vllm ", "python -m sglang", "trtllm-serve "))]
    assert len(commands) == 3
    for c in commands:
        assert c in doc
    assert yaml.safe_load((out / "extra_llm_api_options.yaml").read_text()) == {
        "kv_cache_config": {"enable_block_reuse": True}}


def test_first_worked_example_matches_the_doc(tmp_path, capsys):
    """docs/planner.md's first worked example (the default search with its noise rounds):
    the printout's answer lines as quoted."""
    doc = (ROOT / "docs" / "planner.md").read_text()
    assert main(["plan", str(ROOT / "workloads/plan-70b-1xdgx.toml"), "--disagg",
                 "--no-plot", "--out", str(tmp_path / "o")]) == 0
    lines = capsys.readouterr().out.splitlines()
    quoted = [x for x in lines if x.startswith(("  recommend", "  noise", "  agg/disagg",
                                                "  estimate", "             per kind",
                                                "             still within noise"))]
    assert len(quoted) == 6
    for x in quoted:
        assert x in doc, x
