"""The 2026 hardware presets against their datasheets, their collectives by hand, and node
and GPU files that name an unknown kind refused (docs/hardware.md).

Every expected number below is a datasheet figure written out with its source, not read
from the preset it checks.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from simulator.calibration.generations import GENERATIONS, fitted_reference, transfer_chain
from simulator.cli import main
from simulator.errors import ScenarioError
from simulator.hardware.specs import load_gpu, load_node, transfer_note
from simulator.parallel.collective import allreduce, run_collectives, schedules
from simulator.paths import GPUS, TOPOLOGIES
from simulator.topology.graph import Paths, build_graph, gpus, nvlink_domains

T, G = 1e12, 1e9
GIB = 2**30

#: preset -> dense TFLOP/s (bf16, fp8, fp4; None: no such tensor-core dtype), HBM capacity
#: the datasheet names (GiB of its stacks), HBM TB/s, scale-up bytes/s per GPU per
#: direction (xGMI: the sum of a GPU's seven links) and NIC bytes/s per GPU per direction.
DATASHEET = {
    # NVIDIA HGX B300 datasheet, 8 GPUs: FP4 108 PFLOPS dense, FP8 72 and BF16 36 PFLOPS
    # sparse; 2.1 TB HBM3e (288 GB per GPU), 62 TB/s (AIC b300_sxm.yaml); NVLink 5
    # 1.8 TB/s per GPU bidirectional; 8 x ConnectX-8 800 Gb/s.
    "hgx-b300": ((36e3 / 8 / 2, 72e3 / 8 / 2, 108e3 / 8), 288, 62 / 8, 1.8e12 / 2, 800e9 / 8),
    # NVIDIA GB300 NVL72 datasheet, 72 GPUs: FP4 1,080 PFLOPS dense, FP8 720 and BF16 360
    # PFLOPS sparse; 576 TB/s HBM; 130 TB/s NVLink (1.8 TB/s per GPU); 72 ConnectX-8 at
    # 800 Gb/s.
    "gb300-nvl72": ((360e3 / 72 / 2, 720e3 / 72 / 2, 1080e3 / 72), 288, 576 / 72, 1.8e12 / 2,
                    800e9 / 8),
    # NVIDIA GB200 NVL72 datasheet, 72 GPUs: FP4 1,440, FP8 720, BF16 360 PFLOPS sparse;
    # 13.4 TB HBM3e (186 GB per GPU), 576 TB/s; ConnectX-7 400 Gb/s per GPU (DGX GB200).
    "gb200-nvl72": ((360e3 / 72 / 2, 720e3 / 72 / 2, 1440e3 / 72 / 2), 186, 576 / 72,
                    1.8e12 / 2, 400e9 / 8),
    # AMD Instinct MI300X data sheet: 1,307.4 TFLOPS FP16/BF16 and 2,614.9 FP8 dense,
    # 192 GB HBM3 at 5.3 TB/s, 7 Infinity Fabric links of 128 GB/s (bidirectional);
    # 400 Gb/s NIC per GPU.
    "amd-mi300x": ((1307.4, 2614.9, None), 192, 5.3, 7 * 128e9 / 2, 400e9 / 8),
    # AMD Instinct MI325X data sheet: the MI300X's peaks, 256 GB HBM3E at 6 TB/s.
    "amd-mi325x": ((1307.4, 2614.9, None), 256, 6.0, 7 * 128e9 / 2, 400e9 / 8),
    # AMD Instinct MI355X data sheet: 2,516.6 TFLOPS FP16/BF16, 5,033.2 FP8, 10,066.3
    # MXFP4 dense; 288 GB HBM3E at 8 TB/s; 7 links of 153.6 GB/s (1,075.2 GB/s).
    "amd-mi355x": ((2516.6, 5033.2, 10066.3), 288, 8.0, 1075.2e9 / 2, 400e9 / 8),
}
NEW = ("hgx-b300", "gb300-nvl72", "amd-mi300x", "amd-mi325x", "amd-mi355x")


@pytest.mark.parametrize("preset", sorted(DATASHEET))
def test_peaks_memory_and_links_match_the_datasheet(preset):
    (bf16, fp8, fp4), capacity_gib, hbm_tb_s, scale_up, nic = DATASHEET[preset]
    node = load_node(preset)
    gpu = node.gpu
    assert gpu.peak_flops["bf16"] == pytest.approx(bf16 * T, rel=1e-4)
    assert gpu.peak_flops["fp8"] == pytest.approx(fp8 * T, rel=1e-4)
    if fp4 is None:  # CDNA3 has no FP4 matrix cores: FP4 weights are not offered
        assert "fp4" not in gpu.peak_flops and "fp4" not in gpu.weight_dtypes
    else:
        assert gpu.peak_flops["fp4"] == pytest.approx(fp4 * T, rel=1e-4)
    # The usable memory is the stacks' capacity or up to 7% less (the driver's reserve).
    assert 0.93 * capacity_gib * GIB <= gpu.memory_bytes <= capacity_gib * GIB
    assert gpu.hbm_bandwidth_Bps == pytest.approx(hbm_tb_s * T, rel=1e-3)
    links = 7 if node.scale_up.kind == "xgmi_mesh" else 1
    assert links * node.scale_up.bandwidth_Bps == pytest.approx(scale_up, rel=1e-6)
    assert node.nic.bandwidth_Bps == pytest.approx(nic, rel=1e-6)


def test_cdna4_has_fp6_and_fp4_at_four_times_bf16_and_cdna3_fnuz_fp8():
    mi355 = load_gpu("mi355x")
    assert mi355.peak_flops["fp6"] == mi355.peak_flops["fp4"] == pytest.approx(
        4 * mi355.peak_flops["bf16"], rel=1e-4)
    assert "fp4" in mi355.weight_dtypes
    assert "fnuz" in GENERATIONS["cdna3"]["tensor_core"].lower()
    assert "ocp fp8" in GENERATIONS["cdna4"]["tensor_core"].lower()


def test_nvl72_is_one_nvlink_domain_of_72_and_hgx_b300_of_8():
    for preset, size in (("gb200-nvl72", 72), ("gb300-nvl72", 72), ("hgx-b300", 8)):
        g = build_graph(load_node(preset), 2)
        assert [len(d) for d in nvlink_domains(g)] == [size, size], preset


def test_new_gpus_get_their_own_generations_and_carry_kernels_from_the_nearest_fit():
    gens = {p: load_node(p).gpu.generation for p in NEW}
    assert gens == {"hgx-b300": "blackwell_ultra", "gb300-nvl72": "blackwell_ultra",
                    "amd-mi300x": "cdna3", "amd-mi325x": "cdna3", "amd-mi355x": "cdna4"}
    assert not GENERATIONS["cdna3"]["nvls"] and not GENERATIONS["cdna4"]["nvls"]
    assert transfer_chain("cdna3") == ["cdna3", "hopper"]
    assert transfer_chain("cdna4") == ["cdna4", "blackwell", "hopper"]
    assert transfer_chain("blackwell_ultra") == ["blackwell_ultra", "blackwell", "hopper"]
    assert fitted_reference("cdna4") == "h100_sxm"
    h100, mi300, b300 = load_gpu("h100_sxm"), load_gpu("mi300x"), load_gpu("b300")
    # MI300X: SM-second costs scale by the clocks (1.98 / 2.1 GHz), efficiencies do not.
    ref, car = h100.calibration.decode_for("bf16"), mi300.calibration.decode_for("bf16")
    assert car.seq_sm_s == pytest.approx(ref.seq_sm_s * 1.98e9 / 2.1e9, rel=1e-12)
    assert (car.floor_s, car.bandwidth_eff) == (ref.floor_s, ref.bandwidth_eff)
    # B300 publishes no clock: carried unscaled, but for the softmax exponential, whose SFU
    # rate per SM doubles on Blackwell Ultra (32 against 16 per clock).
    assert b300.calibration.decode_for("bf16") == ref
    pre_ref, pre = h100.calibration.prefill_for("bf16"), b300.calibration.prefill_for("bf16")
    assert pre.exp_sm_s == pytest.approx(pre_ref.exp_sm_s / 2, rel=1e-12)
    assert replace(pre, exp_sm_s=pre_ref.exp_sm_s) == pre_ref
    assert load_gpu("b200").calibration.prefill_for("bf16") == pre_ref
    assert "cdna3 -> hopper" in transfer_note(mi300) and "h100_sxm" in transfer_note(mi300)
    assert transfer_note(h100) == ""  # a GPU with its own fit says nothing


def _nvl72_by_hand(p, n: int, nbytes: float) -> dict[str, float]:
    """NCCL's three all-reduces over n GPUs of one NVLink 5 switch domain: every hop is
    GPU -> switch -> GPU, 2 x 0.5 us, at 900 GB/s per direction (the rack's preset)."""
    a, b = 2 * 0.5e-6, 900e9
    return {"ring": p.ring_launch_s + 2 * (n - 1) * (a + p.ring_step_s)
            + 2 * (n - 1) / n * nbytes / (b * p.ring_eff),
            "tree": p.tree_launch_s + 2 * math.ceil(math.log2(n)) * (a + p.tree_step_s)
            + 2 * nbytes / (b * p.tree_eff),
            "nvls": p.nvls_launch_s + a + nbytes / (b * p.nvls_eff)}


@pytest.mark.parametrize("preset", ["gb200-nvl72", "gb300-nvl72"])
def test_nvl72_allreduce_over_72_gpus_is_priced_on_the_nvlink_domain(preset):
    node = load_node(preset)
    g = build_graph(node, 1)
    paths, group = Paths(g), tuple(gpus(g))
    assert len(group) == 72
    p = node.gpu.calibration.collectives
    cost = allreduce(paths, group, p, in_switch=True)
    for nbytes in (64 * 2**10, 2**30):
        want = _nvl72_by_hand(p, 72, nbytes)
        assert cost.time(nbytes) == pytest.approx(min(want.values()), rel=1e-9)
        assert cost.algorithm(nbytes) == min(want, key=want.get)
    assert cost.algorithm(2**30) == "nvls"
    # The flow-level schedule of NVLS gives the same time, and never leaves NVLink.
    flows = run_collectives(paths, "all_reduce", [group], 2**30, p, algorithm="nvls")
    assert flows.time_s == pytest.approx(_nvl72_by_hand(p, 72, 2**30)["nvls"], rel=1e-9)
    used = {e for ph in schedules(paths, "all_reduce", group, p)["nvls"].phases
            for edges, _ in ph.flows for e in edges}
    assert {g.edges[e]["kind"] for e in used} == {"nvlink"}


def _mi300x():
    node = load_node("amd-mi300x")
    g = build_graph(node, 1)
    return node, g, Paths(g)


def test_mi300x_is_a_full_xgmi_mesh_without_a_switch():
    node, g, _ = _mi300x()
    kinds = [d["kind"] for _, _, d in g.edges(data=True)]
    assert kinds.count("xgmi") == 8 * 7  # one link per pair, two directions
    assert not any(d.get("kind") in ("nvswitch", "pcie_switch") for _, d in g.nodes(data=True))
    assert g.edges["gpu0", "gpu5"]["bandwidth_Bps"] == 64e9
    assert not g.graph["in_switch_reduction"]
    # Utilization divides a GPU's scale-up bytes by all seven of its links.
    assert node.scale_up_per_gpu_Bps == 7 * 64e9
    assert load_node("hgx-b300").scale_up_per_gpu_Bps == 900e9


def test_mi300x_allreduce_is_rccl_ring_over_seven_links_by_hand_and_never_nvls():
    node, g, paths = _mi300x()
    p = node.gpu.calibration.collectives
    group, n, b, a, s = tuple(gpus(g)), 8, 64e9, 0.8e-6, float(2**30)
    # Ring: 2(n-1) steps of one direct hop; n - 1 rings share out each GPU's 7 links.
    ring = p.ring_launch_s + 2 * (n - 1) * (a + p.ring_step_s) + 2 * (n - 1) / n * s / (
        (n - 1) * b * p.ring_eff)
    tree = p.tree_launch_s + 2 * 3 * (a + p.tree_step_s) + 2 * s / (b * p.tree_eff)
    cost = allreduce(paths, group, p, in_switch=True)  # asked for NVLS: there is no switch
    assert {name for name, _, _ in cost.nccl} == {"ring", "tree"}
    assert cost.algorithm(s) == "ring"
    assert cost.time(s) == pytest.approx(min(ring, tree), rel=1e-9)
    assert cost.time(s) == pytest.approx(ring, rel=1e-9)
    # The flow-level schedule: each directed link carries S / (n (n - 1)) per step.
    assert set(schedules(paths, "all_reduce", group, p)) == {"ring", "tree"}
    flows = run_collectives(paths, "all_reduce", [group], s, p)
    assert (flows.algorithm, flows.time_s) == ("ring", pytest.approx(ring, rel=1e-9))
    # Two GPUs share one link: a seventh of the bandwidth of eight.
    two = allreduce(paths, group[:2], p)
    assert two.time(s) == pytest.approx(
        p.ring_launch_s + 2 * (a + p.ring_step_s) + s / (b * p.ring_eff), rel=1e-9)


def test_two_mi300x_nodes_price_the_hierarchical_allreduce_with_mesh_phases():
    node = load_node("amd-mi300x")
    g = build_graph(node, 2)
    paths, p, s = Paths(g), node.gpu.calibration.collectives, float(2**30)
    res = run_collectives(paths, "all_reduce", [tuple(gpus(g))], s, p)
    assert res.algorithm == "hierarchical"
    # In-node reduce-scatter and all-gather over the mesh (7 steps of S/8 split over 7
    # links each), 2 steps of S/16 per rail between the nodes over 50 GB/s NICs.
    lat_mesh, lat_rail = 0.8e-6 + p.ring_step_s, paths.latency("gpu0", "gpu8") + p.ring_step_s
    want = (p.ring_launch_s + 2 * 7 * lat_mesh + 2 * lat_rail
            + 2 * 7 * s / 8 / 7 / (64e9 * p.ring_eff) + 2 * s / 16 / (50e9 * p.ring_eff))
    assert res.time_s == pytest.approx(want, rel=1e-9)


# --- Unknown kinds and keys are refused -----------------------------------------------------

def _node_file(tmp_path, old: str, new: str, preset: str = "amd-mi300x"):
    text = (TOPOLOGIES / f"{preset}.toml").read_text()
    gpu = load_node(preset).gpu.name
    text = text.replace(f'gpu = "{gpu}"', f'gpu = "{GPUS / (gpu + ".toml")}"')
    assert text.count(old) == 1
    path = tmp_path / "my-node.toml"
    path.write_text(text.replace(old, new))
    return path


def _gpu_file(tmp_path, old: str, new: str, preset: str = "mi355x"):
    text = (GPUS / f"{preset}.toml").read_text()
    assert text.count(old) == 1
    path = tmp_path / "my-gpu.toml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize("old, new, message", [
    ('kind = "xgmi_mesh"', 'kind = "torus"',
     r"scale_up.kind = 'torus' is not allowed \(allowed: nvswitch, pcie_switch, "
     r"xgmi_mesh\)"),
    ('kind = "xgmi_mesh"', 'kind = "xgmi-mesh"', r"did you mean 'xgmi_mesh'\?"),
    ('kind = "single_switch"', 'kind = "fat_tree"',
     r"fabric.kind = 'fat_tree' is not allowed \(allowed: single_switch, leaf_spine\)"),
    ("in_switch_reduction = false", "in_switch_reduction = true",
     r"in_switch_reduction = true needs kind = 'nvswitch'"),
    ("gpus_per_node = 8", "gpu_per_node = 8", r"unknown key 'gpu_per_node' \(did you mean "
                                               r"'gpus_per_node'\?\)"),
    ("link = \"xGMI\"", "links = \"xGMI\"", r"unknown key 'scale_up.links'"),
])
def test_a_node_file_with_an_unknown_kind_or_key_is_one_error(tmp_path, old, new, message):
    path = _node_file(tmp_path, old, new)
    with pytest.raises(ScenarioError, match=message) as err:
        load_node(str(path))
    assert str(path) in str(err.value)


@pytest.mark.parametrize("old, new, message", [
    ('generation = "cdna4"', 'generation = "cdna5"',
     r"generation = 'cdna5' is not allowed \(did you mean 'cdna4'\? allowed: ampere, ada, "
     r"hopper, blackwell, blackwell_ultra, cdna3, cdna4\)"),
    ("fp6 = 10066.3e12", "fp3 = 10066.3e12", r"\[peak_flops\] dtype = 'fp3' is not allowed"),
    ("sm_count = 256", "cu_count = 256", r"unknown key 'cu_count'"),
])
def test_a_gpu_file_with_an_unknown_generation_dtype_or_key_is_one_error(tmp_path, old, new,
                                                                         message):
    path = _gpu_file(tmp_path, old, new)
    with pytest.raises(ScenarioError, match=message) as err:
        load_gpu(str(path))
    assert str(path) in str(err.value)


def test_validate_of_a_node_with_an_unknown_kind_exits_2_with_one_line(tmp_path, capsys):
    node = _node_file(tmp_path, 'kind = "xgmi_mesh"', 'kind = "infinity"')
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'name = "s"\n[model]\nname = "llama-3.1-8b"\n[cluster]\n'
                        f'topology = "{node}"\n[workload]\nrate_per_s = 1.0\n'
                        f'num_requests = 1\n')
    assert main(["validate", str(scenario)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert str(node) in lines[0] and "scale_up.kind = 'infinity'" in lines[0]
    assert "allowed: nvswitch, pcie_switch, xgmi_mesh" in lines[0]


def test_every_preset_graph_follows_its_scale_up_kind():
    """An NVSwitch or PCIe node: one switch, each GPU linked to it once; an xGMI node: a
    link per GPU pair and no switch (the old presets' graphs keep their shape)."""
    for path in sorted(TOPOLOGIES.glob("*.toml")):
        node = load_node(path.stem)
        g, n = build_graph(node, 1), node.gpus_per_node
        kinds = [d["kind"] for a, b, d in g.edges(data=True) if d.get("scale_up")]
        switches = [v for v, d in g.nodes(data=True)
                    if d.get("kind") in ("nvswitch", "pcie_switch")]
        if node.scale_up.kind == "xgmi_mesh":
            assert (len(kinds), set(kinds), switches) == (n * (n - 1), {"xgmi"}, []), path
        else:
            assert len(kinds) == 2 * n and len(switches) == 1, path
            assert set(kinds) == {"pcie" if node.scale_up.kind == "pcie_switch" else "nvlink"}
