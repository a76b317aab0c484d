"""The planner: which TP x PP x DP layout and engine limits serve a scenario best, and how
much load one layout sustains.

:func:`plan` enumerates legal layouts (:mod:`~simulator.planner.space`), ranks them by a fast
analytic estimate from the cost model (:mod:`~simulator.planner.estimate`), simulates the best
few and the rule-of-thumb layout (:mod:`~simulator.planner.simulate`) and recommends one
(:mod:`~simulator.planner.plan`). :func:`capacity` bisects the request rate a layout sustains
while meeting its SLOs (:mod:`~simulator.planner.capacity`). See docs/planner.md.
"""

from simulator.planner.capacity import CapacityResult, capacity
from simulator.planner.plan import OBJECTIVES, PlanResult, plan

__all__ = ["OBJECTIVES", "CapacityResult", "PlanResult", "capacity", "plan"]
