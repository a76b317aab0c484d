"""calibrate collect: the shape plan, the files it writes, resuming, and a fit that recovers
the parameters of the model that timed the shapes (tests run on the CPU with stand-in
timers; the PyTorch timer's code path runs on the CPU where torch is installed)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from simulator.calibration import check, moe_fit
from simulator.calibration.collect import collect, parse_families, shapes
from simulator.calibration.collect.timers import ModelTimer
from simulator.calibration.params import Calibration
from simulator.cli import main
from simulator.errors import ScenarioError
from simulator.hardware.specs import load_gpu

H100 = load_gpu("h100_sxm")
DTYPES = ("bfloat16", "fp8")


def test_plan_has_check_columns_and_counts_by_hand():
    plan = shapes.plan(shapes.FAMILIES, DTYPES, DTYPES, max_gpus=4, quick=True)
    for family, df in plan.items():
        want = [c for c in check.COLUMNS[family] if c != "latency_us"]
        assert set(want) <= set(df.columns), family
        assert not df.duplicated().any(), family
    # GEMM: 2 dtypes x 3 weight shapes x 7 token counts.
    assert len(plan["gemm"]) == 2 * 3 * 7
    # NCCL on 4 GPUs: 2 and 4 GPUs x 4 ops x 2 dtypes x 4 sizes; no 8-GPU rows.
    assert len(plan["nccl"]) == 2 * 4 * 2 * 4
    assert set(plan["nccl"]["num_gpus"]) == {2, 4}
    full = shapes.plan(shapes.FAMILIES, DTYPES, DTYPES, max_gpus=8)
    ctx, gen = full["attention_context"], full["attention_generation"]
    assert (ctx["batch_size"] * ctx["q_len"]).max() <= shapes.PREFILL_MAX_TOKENS
    cache = (gen["batch_size"] * (gen["kv_len"] + 1) * gen["num_key_value_heads"]
             * gen["head_dim"] * 4)
    assert cache.max() <= shapes.DECODE_MAX_CACHE_BYTES
    # A window only where the context is longer than it.
    windowed = ctx[ctx["window_size"] > 0]
    assert len(windowed) and (windowed["q_len"] > windowed["window_size"]).all()


def test_plan_sizes_quoted_in_docs():
    """docs/calibrating.md quotes these row counts (8-GPU FP8 machine)."""
    full = shapes.plan(shapes.FAMILIES, DTYPES, DTYPES, max_gpus=8)
    quick = shapes.plan(shapes.FAMILIES, DTYPES, DTYPES, max_gpus=8, quick=True)
    assert {f: len(d) for f, d in full.items()} == {
        "gemm": 480, "attention_context": 480, "attention_generation": 468, "nccl": 264}
    assert {f: len(d) for f, d in quick.items()} == {
        "gemm": 42, "attention_context": 32, "attention_generation": 48, "nccl": 96}


def test_one_gpu_machine_has_no_collectives():
    assert "nccl" not in shapes.plan(("gemm", "nccl"), DTYPES, DTYPES, max_gpus=1)


def test_fit_on_collected_rows_recovers_the_timing_model(tmp_path):
    """Rows timed by the H100's own model, fitted from an empty calibration: the fit must
    price the full (10x larger) plan as that model does."""
    collect("h100_sxm", tmp_path, quick=True, timer="model", progress=False)
    data = check.load_data(tmp_path)
    assert set(data) == set(shapes.FAMILIES)
    fitted = replace(H100, calibration=moe_fit.fit(replace(H100, calibration=Calibration()),
                                                   data))
    link = check.scale_up_for(H100)
    for family, df in shapes.plan(shapes.FAMILIES, DTYPES, DTYPES, 8).items():
        err = np.abs(check.predict(fitted, family, df, link)
                     / check.predict(H100, family, df, link) - 1)
        assert np.median(err) < 0.01, family
        if family != "attention_context":  # head_dim 64 / 256 rows lie outside the quick plan
            assert np.quantile(err, 0.9) < 0.02, family


def test_written_files_read_back_and_readme_says_what_timed_them(tmp_path):
    report = collect("h100_sxm", tmp_path, families=("gemm",), quick=True, timer="model",
                     noise=0.05, seed=3, progress=False)
    df = check.read_family(tmp_path, "gemm")
    assert len(df) == report.written["gemm"] == 42
    assert (df["kernel_source"] == "model").all()
    readme = (tmp_path / "README.md").read_text()
    assert "not a measurement" in readme and "| gemm.csv | 42 |" in readme
    exact = ModelTimer(H100).measure("gemm", shapes.gemm(DTYPES, quick=True))
    ratio = df["latency_us"].to_numpy() / np.array([us for _, us, _ in exact])
    assert 0.8 < ratio.min() < 1 < ratio.max() < 1.25  # sigma 0.05 noise, both signs


class Interrupting:
    """Times rows with the H100 model and raises KeyboardInterrupt after ``stop`` rows."""

    description = "test timer"

    def __init__(self, stop: int | None):
        self.stop, self.timed = stop, 0
        self.model = ModelTimer(H100)

    def max_gpus(self) -> int:
        return 8

    def measure(self, family, table):
        for item in self.model.measure(family, table):
            if self.stop is not None and self.timed == self.stop:
                raise KeyboardInterrupt
            self.timed += 1
            yield item


def test_stopped_collection_keeps_rows_and_resumes(tmp_path):
    first = Interrupting(stop=10)
    with pytest.raises(KeyboardInterrupt):
        collect("h100_sxm", tmp_path, families=("gemm",), quick=True, timer=first,
                progress=False)
    partial = pd.read_csv(tmp_path / "gemm.partial.csv")
    assert len(partial) == 10 and not (tmp_path / "gemm.csv").exists()
    second = Interrupting(stop=None)
    collect("h100_sxm", tmp_path, families=("gemm",), quick=True, timer=second,
            progress=False)
    assert second.timed == 42 - 10  # only the rows not yet timed
    done = pd.read_csv(tmp_path / "gemm.csv")
    assert len(done) == 42 and not done[["dtype", "m", "n", "k"]].duplicated().any()
    assert not (tmp_path / "gemm.partial.csv").exists()
    third = Interrupting(stop=None)
    report = collect("h100_sxm", tmp_path, families=("gemm",), quick=True, timer=third,
                     progress=False)
    assert third.timed == 0 and report.kept == ["gemm"]


class Skipping(Interrupting):
    def measure(self, family, table):
        for i, us, _ in self.model.measure(family, table):
            yield (i, None, "skipped: no fp8 here") if table["dtype"].iloc[i] == "fp8" \
                else (i, us, "test")


def test_rows_a_timer_cannot_run_are_counted_not_written(tmp_path):
    report = collect("h100_sxm", tmp_path, families=("gemm",), quick=True,
                     timer=Skipping(None), progress=False)
    df = pd.read_csv(tmp_path / "gemm.csv")
    assert set(df["dtype"]) == {"bfloat16"} and len(df) == 21
    assert report.skipped[("gemm", "skipped: no fp8 here")] == 21
    assert "gemm: 21 (skipped: no fp8 here)" in (tmp_path / "README.md").read_text()


def test_bad_collect_arguments_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    with pytest.raises(ScenarioError, match="--families: 'gem' is not a family"):
        parse_families("gemm,gem")
    cases = [(["calibrate", "collect", "--gpu", "h100_sxm"], "--out is required"),
             (["calibrate", "collect", "--gpu", "h100_sxm", "--out", str(tmp_path / "o"),
               "--families", "bogus"], "is not a family"),
             (["calibrate", "collect", "--gpu", "h100_sxm", "--out", str(tmp_path / "o"),
               "--timer", "model", "--noise", "3"], "--noise"),
             (["calibrate", "fit", "--gpu", "h100_sxm"], "--data is required")]
    (tmp_path / "file").write_text("x")
    cases.append((["calibrate", "collect", "--gpu", "h100_sxm", "--out",
                   str(tmp_path / "file"), "--timer", "model"], "not a folder"))
    monkeypatch.setitem(sys.modules, "torch", None)  # PyTorch absent
    cases.append((["calibrate", "collect", "--gpu", "h100_sxm", "--out",
                   str(tmp_path / "o")], "PyTorch is not installed"))
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, (argv, err)


def test_ctrl_c_in_collect_exits_130_with_one_line(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("simulator.calibration.collect.collect", interrupted)
    assert main(["calibrate", "collect", "--gpu", "h100_sxm", "--out", str(tmp_path),
                 "--timer", "model"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "resumes" in err[0]


def test_cli_collect_then_fit_end_to_end(tmp_path, capsys):
    out = tmp_path / "h100"
    assert main(["calibrate", "collect", "--gpu", "h100_sxm", "--out", str(out),
                 "--timer", "model", "--quick", "--families", "gemm,nccl"]) == 0
    printed = capsys.readouterr().out
    # NCCL: 2, 4 and 8 GPUs x 4 ops x 2 dtypes x 4 sizes.
    assert "gemm.csv: 42 rows" in printed and "nccl.csv: 96 rows" in printed
    assert main(["calibrate", "fit", "--gpu", "h100_sxm", "--data", str(out), "--out",
                 str(tmp_path / "fit.toml")]) == 0
    assert load_gpu(str(tmp_path / "fit.toml")).calibration.gemm_for("bf16").launch_s > 0


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch absent")
def test_torch_timer_code_path_on_the_cpu():
    from simulator.calibration.collect.torch_ops import TorchTimer

    timer = TorchTimer(device="cpu")
    assert timer.max_gpus() == 1 and "wall clock" in timer.description
    gemm = pd.DataFrame([("bfloat16", 4, 64, 64), ("fp8", 4, 64, 64)],
                        columns=["dtype", "m", "n", "k"])
    got = list(timer.measure("gemm", gemm))
    assert got[0][1] > 0 and got[0][2] == "torch.nn.functional.linear"
    assert got[1][1] is None and got[1][2].startswith("skipped")
    cols = ["batch_size", "q_len", "num_heads", "num_key_value_heads", "head_dim",
            "attn_dtype", "kv_cache_dtype", "window_size"]
    attn = pd.DataFrame([(1, 32, 4, 2, 32, "bfloat16", "bfloat16", 0),
                         (1, 32, 4, 2, 32, "bfloat16", "fp8", 0)], columns=cols)
    for family, table in (("attention_context", attn),
                          ("attention_generation", attn.rename(columns={"q_len": "kv_len"}))):
        (_, us, source), (_, none, why) = timer.measure(family, table)
        assert us > 0 and source == "torch.scaled_dot_product_attention"
        assert none is None and "fp8" in why
