"""The scenario fuzzer, briefly (benchmarks/validation/fuzz_scenarios.py runs it long): every drawn
scenario exits 0 with the run's invariants, or 2 with clean lines naming the file."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from scenario_fuzz import BASE, check, scenarios


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=scenarios())
def test_every_scenario_exits_0_with_invariants_or_2_cleanly(data, tmp_path_factory):
    check(data, tmp_path_factory.mktemp("fuzz"))


def test_the_base_scenario_runs_and_holds_the_invariants(tmp_path):
    assert check(BASE, tmp_path) == "ok"  # the contract's exit-0 branch is reached
