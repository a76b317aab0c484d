"""Discrete-event simulator of distributed LLM inference clusters.

Public API: :func:`load_scenario`, :func:`run` (returns a :class:`Result`),
:func:`sweep` (grid x seeds -> DataFrame), :func:`build_plan`, :func:`write_result`
and :class:`ScenarioError`.
"""

from simulator.cluster.plan import ClusterPlan
from simulator.cluster.pools import build_plan
from simulator.cluster.running import Result, check, run
from simulator.default_scenario import DEFAULT_SCENARIO
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.io.writers import write_result
from simulator.sweep import sweep

__all__ = ["DEFAULT_SCENARIO", "ClusterPlan", "Result", "ScenarioError", "build_plan", "check",
           "load_scenario", "run", "sweep", "write_result"]
__version__ = "0.1.0"
