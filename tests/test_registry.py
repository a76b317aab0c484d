"""simulator.registry: one registry per policy family, filled beside the implementations and
read by the scenario schema, so a new member is one entry."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import toy_scenario

import simulator
from simulator import registry
from simulator.cluster.router import ROUTERS, LeastOutstanding
from simulator.errors import ScenarioError
from simulator.io import schema

FAMILIES = [registry.ROUTERS, registry.SCHEDULERS, registry.PROFILES, registry.CAPTURE_RULES,
            registry.CLIENTS, registry.AUTOSCALE_POLICIES, registry.FORECASTERS]


def _choices(keys: type) -> dict:
    return {f.name: f.metadata.get("choices") for f in dataclasses.fields(keys)}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.key)
def test_each_family_is_filled_by_its_home_and_named_by_the_schema(family):
    assert len(family) >= 2 and family.names() == tuple(family)
    section, key = family.key.split(".")
    keys = schema.SECTIONS.get(section, schema.AutoscaleKeys)
    assert _choices(keys)[key] is family


def test_no_family_is_listed_twice_in_the_schema():
    listed = [v for v in vars(schema).values() if isinstance(v, tuple)
              and v and all(isinstance(x, str) for x in v)]
    for family in FAMILIES:
        assert all(set(t) != set(family) for t in listed), family.key


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(ScenarioError, match=r"router.policy: unknown 'nearest' \(allowed: "
                                            r"round_robin, random, "):
        registry.ROUTERS.get("nearest")
    with pytest.raises(ScenarioError, match="is not allowed"):
        simulator.load_scenario(toy_scenario(router={"policy": "least_outstandng"}))
    with pytest.raises(ValueError, match="registered twice"):
        registry.ROUTERS.add({"random": LeastOutstanding})


def test_a_router_added_in_one_place_is_validated_and_runs():
    class LastReplica:
        """Always the highest index: easy to see in the records."""

        def __init__(self, rng=None, **_):
            pass

        def choose(self, replicas, request):
            return len(replicas) - 1

    ROUTERS.add({"last_replica": LastReplica})
    try:
        s = toy_scenario(router={"policy": "last_replica"}, parallel={"dp": 2},
                         workload={"num_requests": 4})
        res = simulator.run(s)
        assert set(res.requests["replica"]) == {1}
        assert res.summary["requests_completed"] == len(res.requests)
    finally:
        ROUTERS.remove("last_replica")
    with pytest.raises(ScenarioError, match="last_replica.*is not allowed"):
        simulator.load_scenario(toy_scenario(router={"policy": "last_replica"}))
