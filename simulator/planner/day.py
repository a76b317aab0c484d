"""``plan --autoscale``: which layout per replica and which replica bounds serve a day that
changes over time at the lowest cost, at a wanted SLO attainment (docs/autoscaling.md,
"Planning a day").

Two stages. First the layout search as :func:`simulator.planner.plan` runs it, on the
day's peak: the scenario with a stationary Poisson load at the peak rate of its
``[workload.rate_profile]``. Each of the best few layouts that meet the SLOs there (distinct
TP x PP, in the plan's rank order) holds its DP replicas at the peak, which bounds the
fleet. Then the day itself, simulated for each of them with ``[autoscale]`` (the
scenario's table, or the load policy by default) between ``min_replicas`` and those
replicas; the answer is the one with the fewest GPU-hours paid (the lowest cost: one GPU
kind, one price) among those whose whole-day SLO attainment reaches the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import tomli_w

from simulator.cluster.running import run
from simulator.errors import ScenarioError
from simulator.files import out_files
from simulator.io.overrides import set_key
from simulator.io.scenario import load_scenario, to_dict
from simulator.planner.plan import PlanResult, plan
from simulator.planner.space import Limits
from simulator.workload.profile import parse_profile

#: Layouts simulated over the day, by default; requests per candidate at the peak.
DAY_TOP = 3
PEAK_REQUESTS = 500
#: Points at which the profile is read over the run for its peak (its jumps and the
#: cosine's tops added).
PEAK_GRID = 20_000
#: Columns of day_plan.csv.
DAY_COLUMNS = ["rank", "tp", "pp", "max_replicas", "min_replicas", "policy", "gpu_hours",
               "cost_usd", "cost_per_day_usd", "slo_attainment",
               "slo_attainment_worst_window", "replicas_mean", "scale_ups", "meets",
               "peak_rank"]


@dataclass
class DayPlan:
    """What :func:`plan_day` found: the peak rate, the peak plan, the day simulated for the
    best layouts (``table``, ranked), and the answer (``best``: None when no layout reaches
    the attainment; ``scenario`` then is None too)."""

    peak_per_s: float
    attainment: float
    peak_plan: PlanResult
    table: pd.DataFrame
    best: pd.Series | None
    scenario: dict | None = field(default=None, repr=False)


def peak_rate(profile_table: dict, duration_s: float) -> float:
    """The highest rate (req/s) of a ``[workload.rate_profile]`` over ``[0, duration_s]``,
    bursts included, noise left out (its multiplier has mean 1)."""
    problems: list[str] = []
    profile = parse_profile(profile_table, False, problems)
    if profile is None:
        raise ScenarioError(problems[0] if problems else "workload.rate_profile: invalid")
    t = np.union1d(np.linspace(0.0, duration_s, PEAK_GRID + 1), profile.edges(duration_s))
    if profile.shape == "diurnal":  # the cosine's own peaks within the run
        k = np.arange(math.floor(-profile.peak_at_s / profile.period_s),
                      math.ceil((duration_s - profile.peak_at_s) / profile.period_s) + 1)
        tops = profile.peak_at_s + k * profile.period_s
        t = np.union1d(t, tops[(tops >= 0) & (tops <= duration_s)])
    return float(np.max(profile.base(t)))


def _peak_scenario(data: dict, peak: float, requests: int) -> dict:
    """The day's scenario as a stationary Poisson load at ``peak``, without [autoscale]."""
    out = {k: v for k, v in data.items() if k != "autoscale"}
    w = {k: v for k, v in data["workload"].items() if k not in ("rate_profile", "duration_s")}
    out["workload"] = w | {"arrival": "poisson", "rate_per_s": peak, "num_requests": requests}
    return out


def plan_day(scenario: str | dict, *, attainment: float = 0.99, top: int = DAY_TOP,
             requests: int | None = None, jobs: int | None = None,
             overrides: list[str] | None = None, progress: bool = False,
             backend: str = "local", address: str | None = None) -> DayPlan:
    """Plan a day: the layout search on the peak, then the autoscaled day for the best few.

    Parameters
    ----------
    scenario : path or dict
        Model, cluster, SLOs and a time-varying workload (``[workload.rate_profile]``);
        ``[autoscale]`` gives the policy and its keys (default: the load policy), its
        bounds are what is planned.
    attainment : float
        The whole-day SLO attainment the answer must reach, in (0, 1].
    top : int
        Layouts (distinct TP x PP meeting the SLOs at the peak) simulated over the day.
    requests : int, optional
        Requests per candidate of the peak search (default 500).
    jobs, overrides, progress, backend, address
        As for :func:`simulator.planner.plan`.

    Raises
    ------
    ScenarioError
        No rate profile, or an attainment outside (0, 1].
    """
    if not 0 < attainment <= 1:
        raise ScenarioError(f"plan --autoscale: the SLO attainment to reach must be in (0, 1], "
                            f"got {attainment:g}")
    if top < 1:
        raise ScenarioError(f"--top: must be >= 1, got {top}")
    s = load_scenario(scenario, overrides=overrides)
    w = s.workload
    if w.rate_profile is None or w.arrival not in ("poisson", "gamma", "constant"):
        raise ScenarioError("plan --autoscale: needs a load that changes over time: "
                            "[workload.rate_profile] over a poisson, gamma or constant "
                            f"arrival (got arrival = {w.arrival!r}"
                            f"{'' if w.rate_profile is not None else ', no rate_profile'})",
                            source=s.source)
    if s.pools:
        raise ScenarioError("plan --autoscale: replicas of one colocated layout scale; "
                            "remove the [[pools]]", source=s.source)
    data = to_dict(s)
    data["_base_dir"], data["_source"] = s.base_dir, s.source
    data["output"] = {**data.get("output", {}), "steps": False, "trace": False}
    duration = float(w.duration_s) if w.duration_s else 86_400.0
    peak = peak_rate(w.rate_profile, duration)
    peak_plan = plan(_peak_scenario(data, peak, requests or PEAK_REQUESTS), top=max(top, 2),
                     jobs=jobs, progress=progress, backend=backend, address=address)
    met = peak_plan.table[peak_plan.table["slo_met"].astype(bool)]
    picks = met.drop_duplicates(["tp", "pp"]).head(top)
    keys = dict(data.get("autoscale") or {"policy": "load"})
    rows, scenarios = [], []
    gpus = peak_plan.cluster_gpus
    for _, row in picks.iterrows():
        most = gpus // (int(row["tp"]) * int(row["pp"]))
        for top_replicas in _bounds(int(row["dp"]), most):
            day = _day_scenario(data, keys, row, top_replicas)
            summary = run(load_scenario(day), keep_steps=False).summary
            cost = summary.get("autoscale_cost_usd", math.nan)
            a = day["autoscale"]
            rows.append({"tp": int(row["tp"]), "pp": int(row["pp"]),
                         "max_replicas": a["max_replicas"], "min_replicas": a["min_replicas"],
                         "policy": a.get("policy", "none"),
                         "gpu_hours": summary["autoscale_gpu_hours"], "cost_usd": cost,
                         "cost_per_day_usd": cost * 86_400.0 / duration,
                         "slo_attainment": summary["slo_attainment"],
                         "slo_attainment_worst_window": summary["slo_attainment_worst_window"],
                         "replicas_mean": summary["autoscale_replicas_mean"],
                         "scale_ups": summary["autoscale_scale_ups"],
                         "meets": bool(summary["slo_attainment"] >= attainment),
                         "peak_rank": int(row["rank"])})
            scenarios.append(day)
    table = pd.DataFrame(rows, columns=[c for c in DAY_COLUMNS if c != "rank"])
    order = sorted(range(len(rows)), key=lambda i: (not rows[i]["meets"],
                                                    rows[i]["gpu_hours"], rows[i]["peak_rank"]))
    table = table.iloc[order].reset_index(drop=True)
    table.insert(0, "rank", range(1, len(table) + 1))
    best = table.iloc[0] if len(table) and table["meets"].iloc[0] else None
    chosen = scenarios[order[0]] if best is not None else None
    return DayPlan(peak, attainment, peak_plan, table, best, chosen)


def _bounds(dp: int, most: int) -> list[int]:
    """The ``max_replicas`` tried for a layout: the replicas it holds at the peak, and
    half as many again (at least one more) for the noise and the cold starts, within the
    ``most`` the cluster holds."""
    return sorted({min(dp, most), min(most, dp + max(1, dp // 2))})


def _day_scenario(data: dict, keys: dict, row: pd.Series, dp: int) -> dict:
    """The day with the layout and engine limits of a peak plan row, ``dp`` replicas the
    fleet and ``max_replicas``."""
    day = {k: v for k, v in data.items()}
    day["parallel"] = {**data.get("parallel", {}), "tp": int(row["tp"]), "pp": int(row["pp"]),
                       "dp": dp}
    day["engine"] = dict(data.get("engine", {}))
    for key, value in Limits.of_row(row).overrides().items():
        set_key(day, key.split("."), value, "plan --autoscale")
    low = min(int(keys.get("min_replicas", 1)), dp)
    a = {k: v for k, v in keys.items() if k not in ("initial_replicas",)}
    day["autoscale"] = a | {"min_replicas": low, "max_replicas": dp}
    return day


def format_day_plan(result: DayPlan) -> str:
    """The day plan as text: the peak, each layout's day, and the answer."""
    t = result.table
    lines = [f"day plan: peak {result.peak_per_s:.3g} req/s; the best layouts at the peak, "
             f"each with its bounds, simulated over the day ({len(t)} runs), ranked by "
             f"GPU-hours at SLO attainment >= {result.attainment:.1%}",
             f"  {'rank':>4} {'layout':<10} {'replicas':>9} {'GPU-hours':>10} "
             f"{'USD/day':>9} {'SLO att.':>9} {'worst win.':>10} {'mean repl.':>10}"]
    for _, r in t.iterrows():
        usd = f"{r['cost_per_day_usd']:,.0f}" if math.isfinite(r["cost_per_day_usd"]) else "-"
        layout = f"TP{r['tp']} PP{r['pp']}"
        bounds = f"{r['min_replicas']}-{r['max_replicas']}"
        lines.append(f"  {r['rank']:>4} {layout:<10} {bounds:>9} "
                     f"{r['gpu_hours']:>10,.1f} {usd:>9} {r['slo_attainment']:>9.1%} "
                     f"{r['slo_attainment_worst_window']:>10.1%} {r['replicas_mean']:>10.2f}")
    b = result.best
    if b is None:
        lines.append(f"  no layout reaches {result.attainment:.1%} SLO attainment over the "
                     f"day: raise max_replicas (cluster.nodes), lower the policy's target, or "
                     f"accept less")
    else:
        lines += ["  answer:", "    [parallel]", f"    tp = {b['tp']}", f"    pp = {b['pp']}",
                  f"    dp = {b['max_replicas']}", "    [autoscale]",
                  f"    policy = \"{b['policy']}\"", f"    min_replicas = {b['min_replicas']}",
                  f"    max_replicas = {b['max_replicas']}"]
    return "\n".join(lines)


#: The day plan's files beside the peak plan's (plan.csv, candidates.csv, ...).
DAY_PLAN, RECOMMENDED_DAY = "day_plan.csv", "recommended-day.toml"


def write_day_plan(result: DayPlan, out: str | Path) -> list[Path]:
    """Write day_plan.csv and, when a layout reaches the attainment, recommended-day.toml
    (the day with that layout and ``[autoscale]`` bounds: ``python -m simulator run`` it)."""
    names = [DAY_PLAN, *[RECOMMENDED_DAY] * (result.scenario is not None)]
    paths = out_files(out, names, "--out")
    result.table.to_csv(paths[0], index=False)
    if result.scenario is not None:
        b = result.best
        pick = to_dict(load_scenario(result.scenario))
        paths[1].write_text(f"# plan --autoscale: TP{b['tp']} PP{b['pp']} between "
                            f"{b['min_replicas']} and {b['max_replicas']} replicas, "
                            f"{b['gpu_hours']:.1f} GPU-hours at {b['slo_attainment']:.1%} SLO "
                            f"attainment over the day\n" + tomli_w.dumps(pick))
    return paths
