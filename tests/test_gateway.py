"""[gateway]: classes with priorities keep their SLOs under overload while sheddable ones
are shed; token buckets, deadlines and dispatch order by hand; every request once."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_scenario, run
from simulator.errors import ScenarioError


def _scenario(gateway: dict, rate: float = 30.0, n: int = 2000, prompt=1024) -> dict:
    return {"name": "gw", "seed": 0, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 1, "dp": 1},
            "engine": {"max_num_seqs": 32},
            "workload": {"arrival": "poisson", "rate_per_s": rate, "num_requests": n,
                         "prompt_tokens": prompt, "output_tokens": 256},
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "output": {"steps": False},
            "gateway": gateway}


TWO = {"max_queue": 200, "classes": [
    {"name": "critical", "priority": 0, "share": 0.2},
    {"name": "batch", "priority": 2, "share": 0.8, "sheddable": True, "deadline_s": 20.0}]}


def test_critical_keeps_its_slo_while_batch_is_shed_under_overload():
    r = run(load_scenario(_scenario(TWO)))
    s, req = r.summary, r.requests
    # 30 req/s of 1k + 256 tokens is about twice what one H100 serves.
    assert s["class_critical_slo_attainment"] > 0.99
    assert s["class_batch_shed"] > 0 and s["class_batch_expired"] > 0
    assert s["class_critical_shed"] == 0 and s["class_critical_expired"] == 0
    assert s["class_batch_slo_attainment"] < 0.5
    # Every request once: completed, shed (rejected) or expired (dropped).
    assert req["request_id"].is_unique and len(req) == 2000
    assert s["requests_completed"] + s["requests_rejected"] + s["requests_dropped"] == 2000
    assert s["class_critical_requests"] + s["class_batch_requests"] == 2000
    assert set(req["class"]) == {"critical", "batch"}
    expired = req[req["reason"].str.startswith("expired", na=False)]
    np.testing.assert_allclose(expired["finish_s"] - expired["arrival_s"], 20.0, atol=1e-6)


def test_token_bucket_by_hand():
    """Rate 1/s, burst 2, arrivals every 0.25 s (constant), sheddable: a request passes
    when the bucket (2 at the start, +1/s, at most 2) holds a token."""
    gw = {"classes": [{"name": "api", "rate_per_s": 1.0, "burst": 2.0, "sheddable": True}]}
    sc = _scenario(gw, rate=4.0, n=40, prompt=64)
    sc["workload"]["arrival"] = "constant"
    req = run(load_scenario(sc)).requests.sort_values("arrival_s")
    tokens, last, want = 2.0, 0.0, []
    for t in req["arrival_s"]:
        tokens = min(2.0, tokens + (t - last))
        last = t
        want.append(tokens >= 1)
        tokens -= 1 if tokens >= 1 else 0
    assert (req["status"] == "completed").tolist() == want
    assert sum(want) == 11  # the burst at 0.25 and 0.5 s, then one a second from 1.25 s


def test_held_requests_leave_by_priority_and_sjf_takes_short_prompts_first():
    r = run(load_scenario(_scenario(TWO | {"max_queue": 100_000})))
    req = r.requests[r.requests["status"] == "completed"]
    wait = (req["first_scheduled_s"] - req["arrival_s"]).groupby(req["class"]).mean()
    assert wait["critical"] < 0.2 * wait["batch"]
    mixed = _scenario({"order": "sjf", "max_queue": 100_000}, rate=30.0, n=1500)
    mixed["workload"]["prompt_tokens"] = {"dist": "uniform", "min": 100, "max": 4000}
    done = run(load_scenario(mixed)).requests
    late = done[done["arrival_s"] > 20]  # once the queue has built up
    short, long_ = late[late["prompt_tokens"] < 1000], late[late["prompt_tokens"] > 3000]
    assert short["ttft_s"].median() < 0.5 * long_["ttft_s"].median()


def test_fair_order_shares_among_tenants():
    gw = {"tenants": 4, "order": "fair", "max_queue": 100_000}
    r = run(load_scenario(_scenario(gw, n=1500)))
    assert r.summary["fairness_jain"] > 0.95
    assert set(r.requests["tenant"]) == {0, 1, 2, 3}


@pytest.mark.parametrize("gateway, words", [
    ({"classes": []}, "gateway.classes: expected a list of 1 to 64"),
    ({"classes": [{"name": "a b"}]}, "gateway.classes[0].name: expected a plain name"),
    ({"classes": [{"name": "a"}, {"name": "a"}]}, "names two classes"),
    ({"classes": [{"name": "a", "share": 0}]}, "gateway.classes[0].share"),
    ({"classes": [{"name": "a", "burst": 0.5}]}, "gateway.classes[0].burst"),
    ({"classes": [{"name": "a", "sheddable": "yes"}]}, "sheddable: expected true or false"),
    ({"classes": [{"name": "a", "speed": 1}]}, "gateway.classes[0].speed: unknown key"),
    ({"order": "lifo"}, "gateway.order: expected one of fcfs, sjf, fair"),
    ({"saturation_kv": 2}, "gateway.saturation_kv"),
    ({"queue": 5}, "gateway.queue: unknown key"),
])
def test_bad_gateway_tables(gateway, words):
    with pytest.raises(ScenarioError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_scenario(_scenario(gateway))


def test_without_a_gateway_requests_have_no_class():
    sc = _scenario({}, rate=2.0, n=20)
    del sc["gateway"]
    r = run(load_scenario(sc))
    assert "class" not in r.requests and "fairness_jain" not in r.summary


def test_the_printout_gives_each_class_its_attainment():
    from simulator.printout import format_summary

    r = run(load_scenario(_scenario(TWO)))
    s = r.summary
    text = format_summary("gw", s, r.requests)
    assert (f"critical {s['class_critical_slo_attainment']:.1%}, batch "
            f"{s['class_batch_slo_attainment']:.1%} (shed {s['class_batch_shed']:,}, expired "
            f"{s['class_batch_expired']:,})") in text
