"""The bad-input corpus of a day in production: every ``[autoscale]`` key, every
``[gateway]`` and ``[[gateway.classes]]`` key, the bounds against the layout, a policy
where nothing can scale and a load profile with negative rates. Each case runs ``run`` as
:mod:`tests.test_bad_input_corpus` does: exit 2, one line naming the key, nothing
written."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import tomli_w

from simulator.io.schema import AutoscaleKeys
from tests.test_bad_input_corpus import BASE, _rejected

DAY = copy.deepcopy(BASE) | {"parallel": {"tp": 1, "dp": 2}, "autoscale": {"policy": "load"}}
GATEWAY = copy.deepcopy(BASE) | {"gateway": {"classes": [{"name": "a"}]}}


def _with(base: dict, section: str, **keys) -> dict:
    data = copy.deepcopy(base)
    data[section] = {**data.get(section, {}), **keys}
    return data


def _bad_numbers(field: dataclasses.Field) -> list[tuple[str, object]]:
    """Values outside an [autoscale] number's range (its ``gt``/``min``/``max``), not
    finite, and of the wrong kind."""
    meta, integer = field.metadata, "int" in str(field.type)
    out = []
    if "gt" in meta:
        out.append(("at-gt", int(meta["gt"]) if integer else float(meta["gt"])))
    if "min" in meta:
        out.append(("below", meta["min"] - 1))
    if "max" in meta:
        out.append(("above", meta["max"] + 1))
    if not integer:
        out += [("nan", math.nan), ("inf", math.inf)]
    else:
        out.append(("fraction", 1.5))
    return out + [("string", "12"), ("bool", True)]


NUMBERS = [f for f in dataclasses.fields(AutoscaleKeys)
           if any(t in str(f.type) for t in ("int", "float"))]
AUTOSCALE_NUMBERS = [
    pytest.param(_with(DAY, "autoscale", **{f.name: v}), [f"autoscale.{f.name}"],
                 id=f"autoscale-{f.name}-{label}")
    for f in NUMBERS for label, v in _bad_numbers(f)]
AUTOSCALE_CHOICES = [
    pytest.param(_with(DAY, "autoscale", **{k: "bogus"}), [f"autoscale.{k}", "bogus"],
                 id=f"autoscale-{k}-unknown")
    for k in ("policy", "forecaster", "metric", "weights_from")]
AUTOSCALE_CROSS = [
    pytest.param(_with(DAY, "autoscale", speed=1), ["autoscale.speed", "unknown key"],
                 id="autoscale-unknown-key"),
    pytest.param(_with(DAY, "autoscale", max_replicas=3), ["autoscale.max_replicas",
                                                           "parallel.dp = 2"],
                 id="autoscale-max-beyond-the-fleet"),
    pytest.param(_with(DAY, "autoscale", min_replicas=2, max_replicas=1),
                 ["autoscale.min_replicas", "more than max_replicas 1"],
                 id="autoscale-min-above-max"),
    pytest.param(_with(DAY, "autoscale", initial_replicas=2, max_replicas=1),
                 ["autoscale.initial_replicas"], id="autoscale-initial-outside"),
    pytest.param(_with(DAY, "autoscale", scale_down_below=1.0),
                 ["autoscale.scale_down_below", "< 1"], id="autoscale-down-at-1"),
    pytest.param(_with(DAY, "autoscale", policy="sla", forecaster="holt_winters",
                       season_intervals=1), ["autoscale.season_intervals"],
                 id="autoscale-season-of-one"),
    pytest.param(_with(DAY, "workload", arrival="closed_loop", rate_per_s=None,
                       concurrency=2) | {"workload": {
                           k: v for k, v in BASE["workload"].items() if k != "rate_per_s"}
                           | {"arrival": "closed_loop", "concurrency": 2}},
                 ["autoscale", "open-loop"], id="autoscale-closed-loop"),
    pytest.param(DAY | {"autoscale": 3}, ["autoscale", "expected a table"],
                 id="autoscale-not-a-table"),
    pytest.param({k: v for k, v in DAY.items() if k != "parallel"} | {"pools": [
        {"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}]},
                 ["autoscale", "[[pools]]"], id="autoscale-pools-cannot-scale"),
    pytest.param(_with(DAY, "workload", num_requests=None) | {"workload": {
        **{k: v for k, v in BASE["workload"].items() if k not in ("rate_per_s", "num_requests")},
        "duration_s": 60.0, "rate_profile": {"shape": "steps", "at_s": [0.0, 30.0],
                                             "rates_per_s": [1.0, -2.0]}}},
                 ["workload.rate_profile"], id="profile-negative-rate"),
    pytest.param({**DAY, "workload": {
        **{k: v for k, v in BASE["workload"].items() if k not in ("rate_per_s", "num_requests")},
        "duration_s": 60.0, "rate_profile": {"shape": "diurnal", "peak_per_s": 2.0,
                                             "trough_per_s": -1.0}}},
                 ["workload.rate_profile.trough_per_s"], id="profile-negative-trough"),
]
GATEWAY_TOP = [
    pytest.param(_with(GATEWAY, "gateway", **{k: v}), [f"gateway.{k}"], id=f"gateway-{k}-{label}")
    for k, values in {"tenants": [(0, "zero"), (1.5, "fraction"), (2e6, "huge"),
                                  ("4", "string")],
                      "saturation_queue": [(-1, "negative"), (0.5, "fraction")],
                      "saturation_kv": [(0, "zero"), (1.5, "above-1"), (math.nan, "nan")],
                      "max_queue": [(0, "zero"), (True, "bool")],
                      "order": [("lifo", "unknown")],
                      "classes": [([], "empty"), (3, "not-a-list")]}.items()
    for v, label in values] + [
    pytest.param(_with(GATEWAY, "gateway", queue=5), ["gateway.queue", "unknown key"],
                 id="gateway-unknown-key"),
    pytest.param(GATEWAY | {"gateway": 3}, ["gateway", "expected a table"],
                 id="gateway-not-a-table"),
]


def _klass(**keys) -> dict:
    return _with(GATEWAY, "gateway", classes=[{"name": "a", **keys}])


GATEWAY_CLASSES = [
    pytest.param(_klass(**{k: v}), [f"gateway.classes[0].{k}"], id=f"class-{k}-{label}")
    for k, values in {"priority": [(-1, "negative"), (0.5, "fraction")],
                      "share": [(0, "zero"), (math.inf, "inf")],
                      "ttft_slo_s": [(0, "zero"), ("1", "string")],
                      "tpot_slo_s": [(-0.1, "negative")],
                      "deadline_s": [(0, "zero"), (math.nan, "nan")],
                      "rate_per_s": [(0, "zero")],
                      "burst": [(0.5, "below-1")],
                      "sheddable": [("yes", "string")],
                      "name": [("a b", "space"), (5, "int")]}.items()
    for v, label in values] + [
    # The range as allowed: at least 1 (1 itself is fine), a string shown as a string.
    pytest.param(_with(GATEWAY, "gateway", tenants=0),
                 ["gateway.tenants: expected an integer >= 1 (at most 1e+06), got 0"],
                 id="gateway-tenants-range-said"),
    pytest.param(_klass(burst=0.5), ["gateway.classes[0].burst: expected a number >= 1",
                                     "got 0.5"], id="class-burst-range-said"),
    pytest.param(_klass(share="1"), ["gateway.classes[0].share: expected a number > 0",
                                     "got '1'"], id="class-share-string-said"),
    pytest.param(_klass(speed=1), ["gateway.classes[0].speed", "unknown key"],
                 id="class-unknown-key"),
    pytest.param(_with(GATEWAY, "gateway", classes=[{"name": "a"}, {"name": "a"}]),
                 ["gateway.classes[1].name", "names two classes"], id="class-twice"),
    pytest.param(_with(GATEWAY, "gateway", classes=[3]), ["gateway.classes[0]"],
                 id="class-not-a-table"),
]


def _pooled(decode: object = None, prefill: object = None, role: str = "decode",
            **workload) -> dict:
    """BASE as one prefill and one decode pool (2 decode replicas), with ``autoscale``
    tables on them (``role`` = "mixed": two mixed pools)."""
    data = {k: v for k, v in copy.deepcopy(BASE).items() if k != "parallel"}
    data["workload"] = {**data["workload"], **workload}
    roles = ("prefill", "decode") if role == "decode" else ("mixed", "mixed")
    pools = [{"name": "p", "role": roles[0]}, {"name": "d", "role": roles[1], "dp": 2}]
    for pool, table in zip(pools, (prefill, decode), strict=True):
        if table is not None:
            pool["autoscale"] = table
    return data | {"pools": pools}


POOL_AUTOSCALE = [
    pytest.param(_pooled({"policy": "load"}, role="mixed"),
                 ["pools[1].autoscale", "mixed pools do not scale"], id="pool-mixed-cannot-scale"),
    pytest.param(_pooled(3), ["pools[1].autoscale", "expected a table"],
                 id="pool-autoscale-not-a-table"),
    pytest.param(_pooled({"policy": "load", "max_replicas": 3}),
                 ["pools[1].autoscale.max_replicas", "pools[1].dp = 2"],
                 id="pool-max-beyond-its-dp"),
    pytest.param(_pooled({"policy": "load", "min_replicas": 2, "max_replicas": 1}),
                 ["pools[1].autoscale.min_replicas", "more than max_replicas 1"],
                 id="pool-min-above-max"),
    pytest.param(_pooled({"policy": "load", "interval_s": 0.0}),
                 ["pools[1].autoscale.interval_s"], id="pool-interval-zero"),
    pytest.param(_pooled({"policy": "load", "metric": "ttft"}),
                 ["pools[1].autoscale.metric", "kv_util"], id="pool-metric-unknown"),
    pytest.param(_pooled(prefill={"policy": "sla", "forecaster": "arima",
                                  "replica_capacity_per_s": 5.0}),
                 ["pools[0].autoscale.forecaster", "kalman"], id="pool-forecaster-unknown"),
    pytest.param(_pooled({"policy": "sla"}), ["pools[1].autoscale.replica_capacity_per_s",
                                              "required"], id="pool-sla-needs-capacity"),
    pytest.param(_pooled({"policy": "load", "scale_down_below": 1.5}),
                 ["pools[1].autoscale.scale_down_below", "< 1"], id="pool-down-above-1"),
    pytest.param(_pooled({"policy": "load", "polcy": "x"}),
                 ["pools[1].autoscale.polcy", "unknown key"], id="pool-autoscale-unknown-key"),
    pytest.param(_pooled({"policy": "load"}, arrival="closed_loop", rate_per_s=None,
                         concurrency=2), ["pools[1].autoscale", "open-loop"],
                 id="pool-autoscale-closed-loop"),
]
CASES = (AUTOSCALE_NUMBERS + AUTOSCALE_CHOICES + AUTOSCALE_CROSS + GATEWAY_TOP
         + GATEWAY_CLASSES + POOL_AUTOSCALE)


def test_every_autoscale_number_has_bad_cases():
    assert {p.values[1][0] for p in AUTOSCALE_NUMBERS} == {f"autoscale.{f.name}"
                                                           for f in NUMBERS}
    assert len(NUMBERS) >= 20


@pytest.mark.parametrize("data, needles", CASES)
def test_bad_day_input_exits_2_with_one_line(data, needles, tmp_path, monkeypatch, capsys):
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(_no_none(data)))
    _rejected(tmp_path, monkeypatch, capsys,
              ["run", path, "--out", tmp_path / "out", "--quiet"], needles, str(path))


def _no_none(data):
    """TOML has no null: keys set to None are left out."""
    if isinstance(data, dict):
        return {k: _no_none(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [_no_none(v) for v in data]
    return data
