"""Speculative decoding: acceptance sampling, step semantics, token conservation, KV
capacity, draft and verification costs, fast-forward, disable_by_batch_size, input errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import with_kv_tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

import simulator
from simulator.cli import main
from simulator.engine.speculative import Acceptance, uniforms
from simulator.model.memory import weight_bytes_per_gpu
from simulator.model.moe_stage import MoEStageCost
from simulator.model.spec import load_model
from simulator.model.speculative import DraftCost, draft_weight_bytes

SPEC = {"method": "eagle", "num_speculative_tokens": 3, "acceptance": 0.7}


def _one(toy, output: int, spec: dict | None, **engine) -> simulator.Result:
    """One request of 100 prompt tokens and ``output`` tokens, alone on the toy replica."""
    sc = toy(workload={"output_tokens": output}, engine=engine)
    if spec is not None:
        sc["speculative"] = spec
    return simulator.run(sc)


# -- acceptance sampling ------------------------------------------------------------------

@pytest.mark.parametrize("acc", [Acceptance.geometric(0.8, 3),
                                 Acceptance.chain([0.9, 0.5, 0.3, 0.95]),
                                 Acceptance.from_mean(1.7, 5)])
def test_acceptance_draws_follow_their_distribution(acc):
    n = 200_000
    ids, counters = np.divmod(np.arange(n), 997)  # many requests, many steps each
    a = acc.sample(uniforms(12345, ids, counters))
    observed = np.bincount(a, minlength=acc.k + 1)
    expected = acc.pmf() * n
    keep = expected > 0
    assert observed[~keep].sum() == 0
    chi2, p = stats.chisquare(observed[keep], expected[keep])
    assert p > 1e-4, (observed, expected)
    # The mean, within 5 standard errors of its variance.
    var = float(((np.arange(acc.k + 1) - acc.mean) ** 2 * acc.pmf()).sum())
    assert abs(a.mean() - acc.mean) < 5 * np.sqrt(var / n)


def test_acceptance_forms_agree():
    assert Acceptance.chain([0.8] * 4) == Acceptance.geometric(0.8, 4)
    assert Acceptance.geometric(0.8, 3).mean == pytest.approx(0.8 + 0.64 + 0.512)
    assert Acceptance.from_mean(2.0, 4).mean == pytest.approx(2.0, abs=1e-9)
    assert Acceptance.from_mean(4.0, 4).survival == (1.0,) * 4
    assert Acceptance.from_mean(0.0, 4).mean == pytest.approx(0.0, abs=1e-9)
    # Draws depend on the key and the (id, counter) pair only.
    u = uniforms(7, np.array([3, 3, 4]), np.array([0, 1, 0]))
    assert len(set(u.tolist())) == 3 and ((u >= 0) & (u < 1)).all()
    assert uniforms(7, np.array([4]), np.array([0]))[0] == u[2]


def test_run_acceptance_length_matches_the_model(toy):
    sc = toy(workload={"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 200,
                       "output_tokens": 200},
             speculative={"method": "ngram", "num_speculative_tokens": 4,
                          "acceptance": [0.9, 0.8, 0.7, 0.6]})
    res = simulator.run(sc)
    acc = Acceptance.chain([0.9, 0.8, 0.7, 0.6])
    req = res.requests
    steps = int(req["spec_steps"].sum())
    var = float(((np.arange(5) - acc.mean) ** 2 * acc.pmf()).sum())
    assert abs(res.summary["acceptance_length_mean"] - 1 - acc.mean) < 5 * np.sqrt(var / steps)
    assert res.summary["draft_time_share"] == 0.0  # n-gram lookup is CPU work
    # Per request: accepted drafts per verification step.
    assert np.allclose(req["accepted_per_step"], req["accepted_tokens"] / req["spec_steps"])


# -- step semantics -------------------------------------------------------------------------

def test_acceptance_zero_costs_more_than_plain_decoding_and_gives_one_token(toy):
    # Profile "none": the toy's 1 ms CPU step in line with its ~0.1 ms GPU step; with
    # vllm-v1's overlap both steps would show the 1 ms CPU floor and compare equal.
    out = 20
    plain = _one(toy, out, None, profile="none")
    spec = _one(toy, out, {**SPEC, "acceptance": 0.0}, profile="none")
    r = spec.requests.iloc[0]
    assert r["generated_tokens"] == out and r["spec_steps"] == out - 1
    assert r["accepted_tokens"] == 0
    decode = spec.steps[spec.steps["prefill_tokens"] == 0]
    assert len(decode) == out - 1  # one token per step
    assert (decode["decode_tokens"] == 4).all()  # k + 1 positions verified
    plain_decode = plain.steps[plain.steps["prefill_tokens"] == 0]
    # Each verification step costs more than the plain step at the same position, and the
    # drafting comes on top.
    assert (decode["compute_s"].to_numpy() > plain_decode["compute_s"].to_numpy()).all()
    assert spec.requests["tpot_s"].iloc[0] > plain.requests["tpot_s"].iloc[0]
    assert spec.summary["draft_time_share"] > 0


@pytest.mark.parametrize("out", [1 + 5 * 4, 1 + 5 * 4 + 2])
def test_acceptance_one_gives_k_plus_one_tokens_per_step_and_never_overshoots(toy, out):
    res = _one(toy, out, {**SPEC, "acceptance": 1.0})
    r = res.requests.iloc[0]
    steps = -(-(out - 1) // 4)
    assert r["spec_steps"] == steps and r["accepted_tokens"] == 3 * steps
    assert r["generated_tokens"] == out  # the last step's extra tokens are not emitted
    assert len(res.steps[res.steps["prefill_tokens"] == 0]) == steps
    # Per-output-token ITL: the mean over tokens is TPOT.
    assert res.summary["itl_mean_s"] == pytest.approx(r["tpot_s"], rel=1e-9)


def test_verification_is_priced_as_a_chunk_after_the_kv(toy):
    """A verification step of one sequence holding c KV tokens costs what a prefill chunk of
    k + 1 tokens after c cached ones costs (the same StageCost.step call): one sequence,
    though it samples k + 1 positions."""
    res = _one(toy, 9, {**SPEC, "acceptance": 1.0, "method": "ngram"})
    decode = res.steps[res.steps["prefill_tokens"] == 0]
    stage = res.plan.replicas[0].stages[0]
    for c, (_, row) in zip((100, 104), decode.iterrows(), strict=False):
        compute, comm = stage.step(4, 4 * c + 4 * 5 / 2, c, 0, 4, 1)
        assert row["compute_s"] == compute and row["comm_s"] == comm
        assert row["prefill_pairs"] == 4 * c + 10 and row["prefill_ctx"] == c
        assert row["end_s"] - row["start_s"] == pytest.approx(compute + comm, abs=2e-9)


# -- conservation and KV capacity -----------------------------------------------------------

SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(rate=st.floats(1, 80), n=st.integers(1, 40), out_mean=st.integers(1, 200),
       seqs=st.integers(1, 32), k=st.integers(1, 6), alpha=st.floats(0, 1),
       seed=st.integers(0, 2**16), kv_tokens=st.integers(3200, 9000),
       preemption=st.sampled_from(["recompute", "swap"]))
def test_conservation_and_kv_capacity_with_speculation(toy, rate, n, out_mean, seqs, k, alpha,
                                                       seed, kv_tokens, preemption):
    sc = toy(seed=seed,
             workload={"arrival": "poisson", "rate_per_s": rate, "num_requests": n,
                       "prompt_tokens": {"dist": "uniform", "min": 1, "max": 2000},
                       "output_tokens": {"dist": "exponential", "mean": out_mean,
                                         "max": 600}},
             engine={"max_num_seqs": seqs, "max_num_batched_tokens": 256,
                     "max_model_len": 3200, "preemption": preemption},
             speculative={"method": "eagle", "num_speculative_tokens": k,
                          "acceptance": alpha})
    with_kv_tokens(sc, kv_tokens)
    try:
        res = simulator.run(sc)
    except simulator.ScenarioError as exc:
        assert "engine.max_model_len" in str(exc)
        return
    req, steps = res.requests, res.steps
    assert len(req) == n
    done = req[req["status"] == "completed"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    cap = res.summary["kv_blocks_per_replica"] // res.plan.streams_per_replica
    assert steps["kv_blocks"].between(0, cap).all()
    assert (steps["prefill_tokens"] + steps["decode_tokens"] <= 256).all()
    assert (done["accepted_tokens"] <= k * done["spec_steps"]).all()


def test_preemption_under_speculation_keeps_every_token(toy):
    sc = toy(workload={"arrival": "poisson", "rate_per_s": 200.0, "num_requests": 60,
                       "prompt_tokens": 500, "output_tokens": 400},
             engine={"max_num_seqs": 64, "max_num_batched_tokens": 4096,
                     "max_model_len": 1000},
             speculative={**SPEC, "acceptance": 0.6})
    res = simulator.run(with_kv_tokens(sc, 6000))
    assert res.summary["preemptions_total"] > 0
    assert res.summary["requests_completed"] == 60
    assert (res.requests["generated_tokens"] == 400).all()


# -- fast-forward, disabling, determinism ---------------------------------------------------

def test_fast_forward_on_and_off_identical_with_speculation(toy):
    sc = toy(workload={"arrival": "poisson", "rate_per_s": 10.0, "num_requests": 40,
                       "output_tokens": {"dist": "uniform", "min": 1, "max": 300}},
             speculative=SPEC)
    a = simulator.run(sc)
    b = simulator.run({**sc, "engine": {**sc["engine"], "fast_forward": False}})
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.summary["itl_p99_s"] == b.summary["itl_p99_s"]


def test_disable_by_batch_size_decodes_plainly_at_and_above_the_threshold(toy):
    sc = toy(workload={"arrival": "poisson", "rate_per_s": 30.0, "num_requests": 40,
                       "output_tokens": 100},
             speculative={**SPEC, "disable_by_batch_size": 3})
    res = simulator.run(sc)
    decode = res.steps[res.steps["prefill_tokens"] == 0]
    big, small = decode[decode["batch_size"] >= 3], decode[decode["batch_size"] < 3]
    assert len(big) and len(small)
    assert (big["decode_tokens"] == big["batch_size"]).all()
    assert (small["decode_tokens"] == 4 * small["batch_size"]).all()
    assert 0 < res.summary["spec_step_fraction"] < 1


def test_without_the_section_nothing_changes(toy):
    res = simulator.run(toy())
    assert "spec_steps" not in res.requests and "draft_time_share" not in res.summary


# -- draft costs ---------------------------------------------------------------------------

def test_draft_model_cost_is_at_least_its_weight_reads():
    """k forward passes of the draft model each read its weights from HBM at least once."""
    plan = simulator.build_plan(simulator.load_scenario(
        {"model": {"name": "llama-3.1-70b"}, "parallel": {"tp": 8},
         "workload": {"rate_per_s": 1.0, "num_requests": 1}}))
    node, ar = plan.node, plan.replicas[0].stages[0].allreduce
    target, draft = plan.model, load_model("llama-3.2-1b")
    k = 4
    cost = DraftCost("draft_model", target, draft, node.gpu, 8, "bf16", "bf16", ar)
    floor = k * weight_bytes_per_gpu(draft, 8, draft.layers, True, True, "bf16") \
        / node.gpu.hbm_bandwidth_Bps
    assert cost.time(1, 1000, k) >= floor
    eagle = DraftCost("eagle", target, None, node.gpu, 8, "bf16", "bf16", ar)
    assert 0 < eagle.time(1, 1000, k) < cost.time(1, 1000, k)
    assert DraftCost("ngram", target, None, node.gpu, 8, "bf16", "bf16", ar).time(8, 10, k) \
        == 0.0
    # More sequences and more drafts never cost less.
    assert eagle.time(64, 64000, k) >= eagle.time(1, 1000, k)
    assert eagle.time(1, 1000, k + 1) > eagle.time(1, 1000, k)


def test_mtp_on_a_dense_stand_in(toy, tmp_path):
    cfg = json.loads((simulator.paths.ROOT / "tests" / "data" / "toy_model.json").read_text())
    path = tmp_path / "toy_mtp.json"
    path.write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    sc = toy(model={"name": str(path)}, workload={"output_tokens": 30},
             speculative={"method": "mtp", "num_speculative_tokens": 1,
                          "mean_accepted_tokens": 0.85})
    res = simulator.run(sc)
    assert res.requests["generated_tokens"].iloc[0] == 30
    assert res.summary["draft_time_share"] > 0
    # Without MTP layers the method is refused, naming the key.
    with pytest.raises(simulator.ScenarioError, match="speculative.method.*num_nextn_predict"):
        simulator.run(toy(speculative={"method": "mtp", "acceptance": 0.8}))


@pytest.mark.parametrize("spec, message", [
    ({"acceptance": 0.8}, "speculative.method: required"),
    ({"method": "eagle"}, "speculative.acceptance: set exactly one"),
    ({"method": "eagle", "acceptance": 0.8, "mean_accepted_tokens": 1.0},
     "speculative.acceptance: set exactly one"),
    ({"method": "eagle", "acceptance": [0.8, 0.7]}, "list of num_speculative_tokens = 3"),
    ({"method": "eagle", "acceptance": 1.5}, "a probability in"),
    ({"method": "eagle", "mean_accepted_tokens": 4.0}, "must be <= num_speculative_tokens"),
    ({"method": "draft_model", "acceptance": 0.8}, "speculative.draft_model: required"),
    ({"method": "eagle", "draft_model": "llama-3.2-1b", "acceptance": 0.8},
     "speculative.draft_model: only for"),
    ({"method": "eagl", "acceptance": 0.8}, "did you mean 'eagle'"),
    ({"method": "eagle", "acceptance": 0.8, "k": 2}, "speculative.k: unknown key"),
])
def test_bad_speculative_sections_are_refused_with_the_key(toy, spec, message):
    with pytest.raises(simulator.ScenarioError, match=message.replace("(", r"\(")):
        simulator.load_scenario(toy(speculative=spec))


def test_draft_model_must_exist_and_share_the_vocabulary(toy):
    with pytest.raises(simulator.ScenarioError, match="speculative.draft_model: unknown"):
        simulator.run(toy(speculative={"method": "draft_model", "draft_model": "nope",
                                       "acceptance": 0.8}))
    with pytest.raises(simulator.ScenarioError, match="vocabulary"):
        simulator.run(toy(speculative={"method": "draft_model", "draft_model": "llama-3.2-1b",
                                       "acceptance": 0.8}))


# -- interplay: failures, pipeline streams, prefix caching ---------------------------------

@pytest.mark.parametrize("case", ["fault", "pp", "sessions"])
def test_speculation_with_faults_pipelines_and_prefix_caching_keeps_every_token(toy, case):
    w = {"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 120,
         "prompt_tokens": 300, "output_tokens": {"dist": "uniform", "min": 1, "max": 400}}
    sc = toy(workload=w, speculative={**SPEC, "acceptance": 0.6})
    if case == "fault":  # replica 0 dies under its decoders; they re-prefill on replica 1
        sc = toy(cluster={"nodes": 2}, parallel={"dp": 2},
                 workload={**w, "rate_per_s": 40.0, "num_requests": 300, "output_tokens": 600},
                 router={"policy": "least_outstanding"}, recovery={"restart_s": 1.0},
                 speculative={**SPEC, "acceptance": 0.6})
        sc["faults"] = [{"at_s": 3.0, "target": "gpu:0", "duration_s": 1.0}]
    elif case == "pp":  # two micro-batch streams through two stages
        sc["parallel"] = {"tp": 1, "pp": 2}
    else:
        sc["workload"] = {"arrival": "sessions", "rate_per_s": 4.0, "num_requests": 20,
                          "turns": 3, "think_time_s": 1.0, "prompt_tokens": 200,
                          "output_tokens": 150, "shared_prefix_tokens": 512,
                          "hash_block_tokens": 64}
    res = simulator.run(sc)
    req = res.requests
    assert (req["status"] == "completed").all()
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    cap = res.summary["kv_blocks_per_replica"] // res.plan.streams_per_replica
    assert res.steps["kv_blocks"].between(0, cap).all()
    if case == "fault":
        assert res.summary["retries_total"] > 0
    if case == "sessions":
        assert res.summary["prefix_hit_rate"] > 0
    assert res.summary["acceptance_length_mean"] > 1


@pytest.mark.parametrize("kv_tokens", [None, 6000])
def test_always_disabled_speculation_reproduces_plain_decoding_exactly(toy, kv_tokens):
    """The per-sequence arrays, stepping one token at a time (disable_by_batch_size = 1,
    n-gram: no drafter weights), give the aggregate form's results bit for bit, also with
    preemptions."""
    sc = toy(workload={"arrival": "poisson", "rate_per_s": 100.0, "num_requests": 60,
                       "prompt_tokens": {"dist": "uniform", "min": 50, "max": 600},
                       "output_tokens": {"dist": "uniform", "min": 1, "max": 400}},
             engine={"max_num_batched_tokens": 1024, "max_model_len": 1000})
    if kv_tokens:
        with_kv_tokens(sc, kv_tokens)
    plain = simulator.run(sc)
    spec = simulator.run({**sc, "speculative": {"method": "ngram", "acceptance": 0.9,
                                                "disable_by_batch_size": 1}})
    assert spec.summary["spec_step_fraction"] == 0.0
    if kv_tokens:
        assert plain.summary["preemptions_total"] > 0
    pd.testing.assert_frame_equal(plain.requests, spec.requests[plain.requests.columns])
    pd.testing.assert_frame_equal(plain.steps, spec.steps)
    for key in ("itl_mean_s", "itl_p50_s", "itl_p99_s", "tpot_mean_s"):
        assert plain.summary[key] == spec.summary[key]


def test_example_scenarios_validate_and_bad_sections_exit_2(tmp_path, capsys):
    for name in ("eagle", "draft"):
        assert main(["validate", str(simulator.paths.ROOT / "workloads"
                                     / f"spec-70b-{name}.toml")]) == 0
        assert "tokens per verification step" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text('[workload]\nrate_per_s = 1.0\nnum_requests = 5\n'
                   '[speculative]\nmethod = "eagle"\nacceptance = [0.5, "x"]\n')
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "speculative.acceptance" in err and "Traceback" not in err


def test_drafter_weights_and_kv_come_out_of_the_kv_pool():
    base = {"model": {"name": "llama-3.1-70b"}, "parallel": {"tp": 8},
            "workload": {"rate_per_s": 1.0, "num_requests": 1}}
    plain = simulator.build_plan(simulator.load_scenario(base)).memory
    for method, extra in (("ngram", {}), ("eagle", {}),
                          ("draft_model", {"draft_model": "llama-3.2-1b"})):
        sc = simulator.load_scenario({**base, "speculative": {"method": method,
                                                              "acceptance": 0.7, **extra}})
        mem = simulator.build_plan(sc).memory
        target, draft = load_model("llama-3.1-70b"), load_model(extra.get("draft_model",
                                                                          "llama-3.1-70b"))
        weights = draft_weight_bytes(method, target, draft, 8, "bf16")
        kv = {"ngram": 0, "eagle": target.kv_bytes_per_token(2, 8, 1),
              "draft_model": draft.kv_bytes_per_token(2, 8)}[method]
        free = plain.kv_bytes_per_gpu[0] - weights
        assert mem.kv_bytes_per_gpu[0] == pytest.approx(free, rel=1e-12)
        assert mem.kv_blocks == int(free // (plain.block_bytes_per_gpu[0] + 16 * kv))
    assert mem.kv_blocks < plain.kv_blocks


def test_chunked_prefill_and_verification_share_a_step(toy):
    """A prompt admitted while another request speculates runs in the same forward: the
    step's shape is the prompt chunk plus the decoder's k + 1 positions after its KV."""
    sc = toy(workload={"arrival": "constant", "rate_per_s": 20.0, "num_requests": 2,
                       "output_tokens": 601},
             speculative={**SPEC, "acceptance": 1.0, "method": "ngram"})
    res = simulator.run(sc)
    mixed = res.steps[(res.steps["prefill_tokens"] > 0) & (res.steps["decode_tokens"] > 0)]
    assert len(mixed) == 1
    row = mixed.iloc[0]
    kv = row["prefill_ctx"]  # the decoder's KV (the new prompt has nothing cached)
    assert (kv - 100) % 4 == 0 and kv > 100  # prompt + whole steps of k + 1 tokens
    assert row["prefill_tokens"] == 100 and row["decode_tokens"] == 4
    assert row["prefill_pairs"] == 100 * 101 / 2 + 4 * kv + 4 * 5 / 2
    assert row["sampled"] == 4 + 1  # every verified position, and the prompt's first token
    # Two sequences in the kernels and on the host: the prompt, the decoder's k + 1 positions.
    compute, comm = res.plan.replicas[0].stages[0].step(104, row["prefill_pairs"], kv, 0, 5, 2)
    assert (row["compute_s"], row["comm_s"]) == (compute, comm)
    assert (res.requests["generated_tokens"] == 601).all()


def test_deepseek_v3_mtp_drafts_with_its_moe_layer_and_pays_at_low_load():
    path = simulator.paths.ROOT / "workloads" / "spec-deepseek-v3-mtp.toml"
    sc = simulator.load_scenario(path, overrides=["workload.num_requests=6"])
    plan = simulator.build_plan(sc)
    head = plan.speculative.draft.__self__.stage
    assert isinstance(head, MoEStageCost) and head.layers == 1
    # The MTP layer's weights (its experts on this rank) and its MLA cache come out of the
    # KV pool; the pool keeps one cache per attention-DP rank.
    plain = simulator.build_plan(simulator.load_scenario(
        path, overrides=["speculative.method=ngram"])).memory
    assert plan.memory.kv_blocks < plain.kv_blocks and plan.memory.kv_blocks % 16 == 0
    one = {"arrival": "closed_loop", "concurrency": 1, "num_requests": 3}
    sc = {**simulator.io.scenario.to_dict(sc), "output": {"steps": False}}
    sc["workload"] = {**{k: v for k, v in sc["workload"].items() if k != "rate_per_s"}, **one}
    spec = simulator.run(sc)
    plain = simulator.run({k: v for k, v in sc.items() if k != "speculative"})
    assert (spec.requests["generated_tokens"] == spec.requests["output_tokens"]).all()
    assert 0 < spec.summary["draft_time_share"] < 0.1  # one layer of 62
    assert spec.summary["tpot_mean_s"] < 0.8 * plain.summary["tpot_mean_s"]


# -- speculation as a decode policy of every scheduler ---------------------------------------

OTHER_SCHEDULERS = ["vllm_v0", "sarathi", "orca", "static"]


@pytest.mark.parametrize("scheduler", OTHER_SCHEDULERS)
@pytest.mark.parametrize("out", [1 + 5 * 4, 1 + 5 * 4 + 2])
def test_every_scheduler_with_acceptance_one_gives_k_plus_one_tokens_per_step(toy, scheduler,
                                                                               out):
    """One request alone, acceptance 1.0, k = 3: after the prefill's first token each
    verification step brings 4 tokens, ceil((out - 1) / 4) steps, the last one cut to the
    tokens left."""
    res = _one(toy, out, {**SPEC, "acceptance": 1.0}, scheduler=scheduler)
    r = res.requests.iloc[0]
    steps = -(-(out - 1) // 4)
    assert r["status"] == "completed" and r["generated_tokens"] == out
    assert r["spec_steps"] == steps and r["accepted_tokens"] == 3 * steps
    decode = res.steps[res.steps["prefill_tokens"] == 0]
    assert len(decode) == steps
    assert (decode["decode_tokens"] == 4).all()  # k + 1 positions verified per step
    # Verification after c KV tokens: c = 100 prompt tokens, then 4 more per step.
    assert decode["prefill_ctx"].tolist() == [100 + 4 * j for j in range(steps)]


@pytest.mark.parametrize("scheduler", OTHER_SCHEDULERS)
def test_every_scheduler_speculating_accounts_for_every_request(toy, scheduler):
    w = {"arrival": "poisson", "rate_per_s": 40.0, "num_requests": 80,
         "prompt_tokens": {"dist": "uniform", "min": 50, "max": 600},
         "output_tokens": {"dist": "uniform", "min": 1, "max": 300}}
    sc = toy(workload=w, engine={"scheduler": scheduler, "max_num_seqs": 16,
                                 "max_num_batched_tokens": 1024, "max_model_len": 1000},
             speculative={**SPEC, "acceptance": 0.6})
    res = simulator.run(with_kv_tokens(sc, 12000))
    req, steps = res.requests, res.steps
    assert len(req) == 80 and (req["status"] == "completed").all()
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    assert (req["accepted_tokens"] <= 3 * req["spec_steps"]).all()
    assert res.summary["acceptance_length_mean"] > 1
    cap = res.summary["kv_blocks_per_replica"] // res.plan.streams_per_replica
    assert steps["kv_blocks"].between(0, cap).all()
    assert steps["batch_size"].le(16).all()
    if scheduler == "vllm_v0":  # a step is all prefill or all decode
        assert ((steps["prefill_tokens"] == 0) | (steps["decode_tokens"] == 0)).all()
    if scheduler in ("orca", "static"):  # memory reserved at admission: decodes take none
        only = (steps["prefill_tokens"] == 0).to_numpy()
        grew = steps["kv_blocks"].diff().to_numpy()[1:] > 0
        assert not (grew & only[1:] & only[:-1]).any()


@pytest.mark.parametrize("scheduler", OTHER_SCHEDULERS)
def test_every_scheduler_with_speculation_always_disabled_is_plain_decoding(toy, scheduler):
    """disable_by_batch_size = 1: the speculative decoding set steps one token at a time and
    gives the scheduler's plain results bit for bit."""
    sc = toy(workload={"arrival": "poisson", "rate_per_s": 100.0, "num_requests": 60,
                       "prompt_tokens": {"dist": "uniform", "min": 50, "max": 600},
                       "output_tokens": {"dist": "uniform", "min": 1, "max": 400}},
             engine={"scheduler": scheduler, "max_num_batched_tokens": 1024,
                     "max_model_len": 1000})
    plain = simulator.run(sc)
    spec = simulator.run({**sc, "speculative": {"method": "ngram", "acceptance": 0.9,
                                                "disable_by_batch_size": 1}})
    assert spec.summary["spec_step_fraction"] == 0.0
    pd.testing.assert_frame_equal(plain.requests, spec.requests[plain.requests.columns])
    pd.testing.assert_frame_equal(plain.steps, spec.steps)
