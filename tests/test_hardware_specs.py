"""Node and GPU files are parsed once per version (path and modification time): a load
after the first returns the same spec without reading the file again, a changed file is
read again (by :func:`load_node`, and so by the engine profile's GPU-dependent limits at
scenario load), and a node file whose ``gpu`` is not a name is one clear error."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.hardware import specs
from simulator.hardware.specs import load_gpu, load_node
from simulator.io.scenario import load_scenario
from simulator.paths import GPUS, TOPOLOGIES


def _files(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of dgx-h100 whose GPU is a copy of h100_sxm, both in tmp_path."""
    gpu = tmp_path / "my_gpu.toml"
    shutil.copy(GPUS / "h100_sxm.toml", gpu)
    node = tmp_path / "my_node.toml"
    node.write_text((TOPOLOGIES / "dgx-h100.toml").read_text()
                    .replace('gpu = "h100_sxm"', 'gpu = "my_gpu.toml"'))
    return node, gpu


def _edit(path: Path, old: str, new: str) -> None:
    """Rewrite the file, its modification time a second later (whatever the clock's grain)."""
    before = path.stat().st_mtime_ns
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    os.utime(path, ns=(before + 10**9, before + 10**9))


def _scenario(node: Path) -> dict:
    return {"name": "s", "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": str(node)},
            "workload": {"rate_per_s": 1.0, "num_requests": 1}}


def test_a_second_load_reads_no_file(tmp_path, monkeypatch):
    node, _ = _files(tmp_path)
    first = load_node(str(node))
    assert first == load_node("dgx-h100")  # the same numbers as the preset
    reads = []
    real = specs._read
    monkeypatch.setattr(specs, "_read", lambda p, k: reads.append(p) or real(p, k))
    again = load_node(str(node))
    assert again == first and again.gpu is first.gpu and reads == []
    assert load_gpu("h100_sxm") is load_gpu("h100_sxm")


def test_a_changed_file_is_read_again(tmp_path):
    node, gpu = _files(tmp_path)
    assert load_node(str(node)).gpus_per_node == 8
    big = load_scenario(_scenario(node)).engine
    assert (big.max_num_seqs, big.max_num_batched_tokens) == (1024, 8192)
    # A 40 GiB GPU: vLLM V1's limits for small GPUs.
    _edit(gpu, "memory_bytes = 85520809984", "memory_bytes = 42949672960")
    assert load_node(str(node)).gpu.memory_bytes == 40 * 2**30
    small = load_scenario(_scenario(node)).engine
    assert (small.max_num_seqs, small.max_num_batched_tokens) == (256, 2048)
    _edit(node, "gpus_per_node = 8", "gpus_per_node = 4")
    assert load_node(str(node)).gpus_per_node == 4


def test_a_gpu_that_is_not_a_name_is_one_error(tmp_path):
    node, _ = _files(tmp_path)
    _edit(node, 'gpu = "my_gpu.toml"', "gpu = 5")
    with pytest.raises(ScenarioError, match="bad field"):
        load_node(str(node))
    # The profile leaves the limits to its defaults; building the scenario reports the file.
    engine = load_scenario(_scenario(node)).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (1024, 8192)


def test_a_relative_path_from_another_folder_is_another_file(tmp_path, monkeypatch):
    """The cache keys a file by its absolute path: the same relative path read from two
    working folders gives each folder's own GPU file, even at the same modification time."""
    src = GPUS / "h100_sxm.toml"
    for sub, name in (("a", "GPU A"), ("b", "GPU B")):
        (tmp_path / sub).mkdir()
        text = src.read_text().replace('name = "h100_sxm"', f'name = "{name}"', 1)
        (tmp_path / sub / "g.toml").write_text(text)
        os.utime(tmp_path / sub / "g.toml", ns=(1_000_000_000, 1_000_000_000))
    names = []
    for sub in ("a", "b"):
        monkeypatch.chdir(tmp_path / sub)
        names.append(load_gpu("g.toml").name)
    assert names == ["GPU A", "GPU B"]


def test_a_flat_efficiency_table_is_refused_naming_the_key(tmp_path):
    """The older flat ``[efficiency]`` table is not read as a calibration: one error names it
    and the keys a GPU file allows, so a file that used it is never priced by a silent
    default."""
    node, gpu = _files(tmp_path)
    gpu.write_text(gpu.read_text() + "\n[efficiency]\ngemm_compute = 0.5\n")
    with pytest.raises(ScenarioError, match=r"efficiency.*calibration|calibration.*efficiency"):
        load_node(str(node))
