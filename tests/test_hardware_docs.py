"""Every figure docs/hardware.md quotes: the presets table from the files, the all-reduce
table from the collective model, the worked ``validate`` and the runs of the worked example
on four presets."""

from __future__ import annotations

import re

import pytest

from simulator.cli import main
from simulator.cluster.running import run
from simulator.errors import ScenarioError
from simulator.hardware.specs import load_gpu, load_node, transfer_note
from simulator.io.scenario import load_scenario
from simulator.parallel.collective import run_collectives
from simulator.paths import ROOT, TOPOLOGIES
from simulator.topology.graph import Paths, build_graph, gpus

DOC = (ROOT / "docs" / "hardware.md").read_text()
EXAMPLE = ROOT / "workloads" / "llama70b-mi300x.toml"


def _rows(header: str) -> list[list[str]]:
    """The cells of the markdown table whose header row starts with ``header``."""
    block = DOC[DOC.index(header):].split("\n\n")[0].splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in block[2:]]


def _tflops(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e12:,.0f}"


def test_the_presets_table_is_every_preset_file():
    rows = {r[0].strip("`"): r for r in _rows("| preset | GPU (generation)")}
    assert set(rows) == {p.stem for p in TOPOLOGIES.glob("*.toml")}
    for name, row in rows.items():
        node = load_node(name)
        gpu, up, pk = node.gpu, node.scale_up, node.gpu.peak_flops
        bw = f"{up.bandwidth_Bps / 1e9:g}"
        link = f"xGMI {bw} (x 7)" if up.kind == "xgmi_mesh" else f"{up.link} {bw}"
        assert row[1:10] == [f"{gpu.name} ({gpu.generation})", str(node.gpus_per_node),
                             _tflops(pk.get("bf16")), _tflops(pk.get("fp8")),
                             _tflops(pk.get("fp4")), f"{gpu.memory_bytes / 2**30:.1f}",
                             f"{gpu.hbm_bandwidth_Bps / 1e12:g}", link,
                             f"{node.nic.bandwidth_Bps * 8 / 1e9:g}"], name


def test_the_allreduce_table_is_the_collective_model():
    for preset, n, algorithm, busbw in _rows("| preset | GPUs | algorithm |"):
        node = load_node(preset.strip("`"))
        g = build_graph(node, 1)
        res = run_collectives(Paths(g), "all_reduce", [tuple(gpus(g))[: int(n)]], 2**30,
                              node.gpu.calibration.collectives)
        assert (res.algorithm, f"{res.busbw_bytes_per_s / 1e9:.1f}") == (algorithm, busbw)


def test_the_worked_validate_prints_what_the_doc_shows(capsys):
    assert main(["validate", str(EXAMPLE.relative_to(ROOT))]) == 0
    out = capsys.readouterr().out.splitlines()
    block = DOC[DOC.index("```text\nworkloads/llama70b-mi300x.toml: valid"):]
    shown = block.split("```")[1].strip().splitlines()[1:]
    assert shown and all(line in out for line in shown), (shown, out)
    note = f"  kernels    {transfer_note(load_gpu('mi300x'))}"
    assert note in out and DOC.count(note) == 2


def test_the_worked_runs_give_the_doc_figures():
    rows = _rows("| preset | TTFT p50 s |")
    got = {}
    for preset, ttft, tpot, tpot99, tok in rows:
        name = preset.strip("`")
        s = run(load_scenario(EXAMPLE, [f"cluster.topology={name}"])).summary
        got[name] = s
        assert [f"{s['ttft_p50_s']:.3f}", f"{s['tpot_p50_s']:.4f}", f"{s['tpot_p99_s']:.4f}",
                f"{s['throughput_tok_per_s']:.1f}"] == [ttft, tpot, tpot99, tok], name
    ratio = got["dgx-h100"]["tpot_p50_s"] / got["amd-mi300x"]["tpot_p50_s"]
    assert f"TPOT by only {ratio:.2f}x" in DOC
    hbm = load_gpu("mi300x").hbm_bandwidth_Bps / load_gpu("h100_sxm").hbm_bandwidth_Bps
    assert f"({hbm:.2f}x)" in DOC


def test_the_kv_blocks_and_allreduce_quoted_for_mi300x_and_h100(capsys):
    for preset, blocks in (("amd-mi300x", "531,689"), ("dgx-h100", "201,270")):
        assert main(["validate", str(EXAMPLE), "--set", f"cluster.topology={preset}"]) == 0
        out = capsys.readouterr().out
        assert f"KV cache {blocks.replace(',', '')} blocks" in out, preset
        assert blocks in DOC
        # "14.7 us each at 64 tokens on both"
        assert "64 tokens take 14.7 us (two_shot)" in out, preset
    assert "14.7 us each at 64 tokens on both" in DOC


def test_the_quoted_refusal_is_the_loader_s(tmp_path):
    text = (TOPOLOGIES / "amd-mi300x.toml").read_text().replace('kind = "xgmi_mesh"',
                                                                 'kind = "torus"')
    (tmp_path / "my-node.toml").write_text(text)
    with pytest.raises(ScenarioError) as err:
        load_node("my-node.toml", tmp_path)
    quoted = re.search(r"cluster.topology: node file 'my-node.toml': (.*)", DOC).group(1)
    assert str(err.value).endswith(quoted)
