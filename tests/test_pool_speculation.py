"""Per-pool speculation: a ``[[pools]]`` entry's ``speculative = false`` or
``[pools.speculative]`` table over the scenario's ``[speculative]`` section; prefill pools
never speculate; scenarios without these keys run as before; the planner writes the
speculation of a disaggregated pick on its decode pool only."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from test_planner_search import SPEC, search_setup

from simulator import run
from simulator.cli import main
from simulator.cluster.pools import build_plan, describe_pools
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.planner import plan
from simulator.planner.candidates import spec_options
from simulator.planner.estimate import StepModel, spec_step, step_mix
from simulator.planner.report import recommended_scenario
from simulator.sweep import resolve_point


def _pool(name: str, role: str, **keys) -> dict:
    """A TP1 pool of SPEC's Llama-3.1-8B on the first pool's node, packed."""
    out = {"name": name, "role": role, "tp": 1, "placement": "packed",
           "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048}, **keys}
    if role != "prefill":
        out["same_nodes_as"] = "prefill"
    return out


def _three_decode_pools(requests: int = 30) -> dict:
    """SPEC (EAGLE, k = 3, acceptance 0.7, 0.5 req/s of 256 + 128 tokens) with a prefill
    pool and three decode pools: one at the section's k = 3, one at its own k = 1, one
    plain; the decode router sends each request to the least loaded decode replica."""
    data = copy.deepcopy(search_setup(SPEC, requests)[0])
    data["pools"] = [_pool("prefill", "prefill"), _pool("k3", "decode"),
                     _pool("k1", "decode", speculative={"num_speculative_tokens": 1}),
                     _pool("plain", "decode", speculative=False)]
    return data


@pytest.fixture(scope="module")
def three():
    return run(_three_decode_pools())


def _step_model():
    """The TP1 replica's step model (the pools' stage costs) and SPEC's speculative
    options at each k the plan searches."""
    base = search_setup(SPEC)[0]
    cp = build_plan(load_scenario(resolve_point(base, {"parallel.tp": 1}, 2)))
    m = StepModel(cp, 0.0 if cp.scenario.engine.cpu_overlap
                  else cp.scenario.engine.step_overhead_s, 1)
    return m, {o.k: o for o in spec_options(cp)}


def test_each_decode_pool_speculates_as_it_says(three):
    """At 0.5 req/s each decode replica carries about one sequence (128 tokens at ~3-7 ms
    per token, a new request every 2 s), so a request's TPOT is one step divided by the
    tokens it yields: plain, ``cycle(1)``; at k, the speculative step (drafting, then k + 1
    positions verified) over ``1 + E[A]``, ``E[A] = sum_{i<=k} 0.7^i`` (geometric)."""
    q = three.requests
    m, opts = _step_model()
    p, o = 256.0, 128.0
    tpot = q.groupby("decode_pool")["tpot_s"].mean()
    plain = m.cycle(*step_mix(1.0, 0.0, p, o))
    assert tpot["plain"] == pytest.approx(plain, rel=0.05)
    for k, pool in ((3, "k3"), (1, "k1")):
        gain = 1 + sum(0.7**i for i in range(1, k + 1))
        assert opts[k].accepted == pytest.approx(gain - 1, rel=1e-9)
        # Acceptance is drawn per step: 10 requests x 128 tokens per pool leave a few %.
        assert tpot[pool] == pytest.approx(spec_step(m, opts[k], 1.0, 0.0, p, o) / gain,
                                           rel=0.05)
    # k = 3 yields 2.53 tokens per step for a slightly dearer step than k = 1's 1.7.
    assert tpot["k3"] < 0.85 * tpot["k1"] < 0.85 * tpot["plain"]
    assert set(q["decode_pool"]) == {"k3", "k1", "plain"}  # every decode pool served requests


def test_each_pool_pays_for_its_own_drafter(three):
    """The drafter's weights and KV come out of the speculating pools' KV caches only; the
    prefill pool and the plain decode pool keep the cache of a plain replica."""
    kv = three.summary["kv_tokens_per_replica"]
    pre, k3, k1, plain = kv
    assert pre == plain
    assert k3 == k1 < plain  # one EAGLE layer, whatever k
    assert three.summary["acceptance_length_mean"] > 1.5
    pools = build_plan(load_scenario(_three_decode_pools()))
    text = describe_pools(pools)
    assert "pool k1 (decode)" in text and "speculative eagle k=1" in text
    assert "speculative eagle k=3" in text
    assert [p.speculative is not None for p in pools.pools] == [False, True, True,
                                                                     False]


def test_the_section_on_the_decode_pool_runs_as_the_top_level_one():
    """The same settings as ``[speculative]`` or as the decode pool's own table give the
    same run, request for request (so a plan's recommended.toml, which writes them on the
    decode pool, runs as the plan simulated)."""
    data = copy.deepcopy(search_setup(SPEC, 20)[0])
    data["pools"] = [_pool("prefill", "prefill"), _pool("decode", "decode")]
    top = run(data).requests
    own = copy.deepcopy(data)
    own["pools"][1]["speculative"] = own.pop("speculative")
    assert own.get("speculative") is None
    per_pool = run(own).requests
    assert per_pool.equals(top)


@pytest.mark.parametrize("where, value, message", [
    (0, False, "pools[0].speculative: a prefill pool never speculates"),
    (0, {"num_speculative_tokens": 1}, "pools[0].speculative: a prefill pool never "
                                       "speculates"),
    (1, True, "pools[1].speculative: expected false (this pool does not speculate) or a "
              "table of [speculative] keys, got bool True"),
    (1, 3, "pools[1].speculative: expected false"),
    (1, {"num_speculative_tokenz": 1}, "pools[1].speculative.num_speculative_tokenz: "
                                       "unknown key (did you mean 'num_speculative_tokens'"),
    (1, {"num_speculative_tokens": 100}, "pools[1].speculative.num_speculative_tokens: "
                                         "must be <= 64, got 100"),
    (1, {"method": "medusa"}, "pools[1].speculative.method: 'medusa' is not allowed"),
    (1, {"mean_accepted_tokens": 2.0}, "pools[1].speculative.acceptance: set exactly one"),
])
def test_bad_pool_speculation_is_one_clear_message(where, value, message):
    data = copy.deepcopy(search_setup(SPEC, 20)[0])
    data["pools"] = [_pool("prefill", "prefill"), _pool("decode", "decode")]
    data["pools"][where]["speculative"] = value
    with pytest.raises(ScenarioError) as exc:
        load_scenario(data)
    assert len(exc.value.problems) == 1, exc.value.problems
    assert exc.value.problems[0].startswith(message), exc.value.problems


def test_a_pool_table_without_the_section_needs_a_method():
    """Without ``[speculative]`` the table is a whole section: its method is required."""
    data = copy.deepcopy(search_setup(SPEC, 20)[0])
    del data["speculative"]
    data["pools"] = [_pool("prefill", "prefill"),
                     _pool("decode", "decode", speculative={"acceptance": 0.7})]
    with pytest.raises(ScenarioError) as exc:
        load_scenario(data)
    assert exc.value.problems == ["pools[1].speculative.method: required (draft_model, "
                                  "eagle, mtp or ngram)"]
    data["pools"][1]["speculative"]["method"] = "eagle"
    s = load_scenario(data)
    assert s.speculative is None
    assert s.pools[1].speculative_of(None).num_speculative_tokens == 3  # the default k


def test_bad_pool_speculation_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\n[model]\nname = "llama-3.1-8b"\n'
                    '[speculative]\nmethod = "eagle"\nacceptance = 0.7\n'
                    '[[pools]]\nname = "prefill"\nrole = "prefill"\nspeculative = false\n'
                    '[[pools]]\nname = "decode"\nrole = "decode"\n'
                    'same_nodes_as = "prefill"\n')
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "pools[0].speculative: a prefill pool never speculates" in err
    assert "Traceback" not in err


def test_disaggregated_speculative_pick_speculates_on_its_decode_pool(tmp_path):
    """The planner's recommended.toml of a speculating disaggregated row: no top-level
    section, the decode pool's own table at the row's k; of a plain row: no speculation."""
    r = plan(SPEC, gpus=2, top=2, requests=20, jobs=1, disagg=True, objective="min_tpot")
    c = r.candidates
    dis = c[(c["kind"] == "disaggregated") & (c["status"] == "feasible")]
    for k in (3, 0):
        row = dis[dis["spec_k"] == k].iloc[0]
        rec = recommended_scenario(dataclasses.replace(r, best=row))
        assert "speculative" not in rec
        pre, dec = rec["pools"]
        assert "speculative" not in pre
        s = load_scenario(rec)
        if k:
            assert dec["speculative"] == {"method": "eagle", "num_speculative_tokens": 3,
                                          "acceptance": 0.7}
            assert s.pools[1].speculative_of(s.speculative).num_speculative_tokens == 3
        else:
            assert "speculative" not in dec and s.pools[1].speculative_of(None) is None


@pytest.mark.parametrize("scheduler", ["vllm_v0", "sarathi", "orca", "static"])
def test_decode_pools_of_every_scheduler_speculate_and_keep_every_token(scheduler):
    data = _three_decode_pools()
    for pool in data["pools"][1:]:
        pool["engine"]["scheduler"] = scheduler
    req = run(data).requests
    assert (req["status"] == "completed").all()
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    assert req["spec_steps"].sum() > 0
    assert (req["accepted_tokens"] <= 3 * req["spec_steps"]).all()
