"""What the CLI prints about a run: a one-line verdict, the summary rows, the figures of the
run's mode (pools, speculation, prefix caching, MoE, cost, energy, the alerts that fired),
then what did not go as asked (requests not completed and why, outages, retries).

The mode keys (:data:`MODE_KEYS`) are shared with ``report`` and ``compare``
(:mod:`simulator.report`).
"""

from __future__ import annotations

import math

import pandas as pd

from simulator.planner.simulate import keep_up

ROWS = [("requests completed / total", "requests_completed", "{:.0f}", "requests_total"),
        ("TTFT mean / p50 / p99 (s)", "ttft_mean_s", "{:.3f}", "ttft_p50_s", "ttft_p99_s"),
        ("TPOT mean / p50 / p99 (s)", "tpot_mean_s", "{:.4f}", "tpot_p50_s", "tpot_p99_s"),
        ("E2E mean / p99 (s)", "e2e_mean_s", "{:.2f}", "e2e_p99_s"),
        ("queue mean / p99 (s)", "queue_mean_s", "{:.3f}", "queue_p99_s"),
        ("output throughput (tok/s)", "throughput_tok_per_s", "{:.1f}"),
        ("throughput / goodput (req/s)", "throughput_req_per_s", "{:.3f}", "goodput_req_per_s"),
        ("steady output tok/s, goodput", "throughput_steady_tok_per_s", "{:.1f}",
         "goodput_steady_req_per_s"),
        ("SLO attainment", "slo_attainment", "{:.3f}"),
        ("batch efficiency (mean)", "batch_efficiency_mean", "{:.3f}"),
        ("pipeline bubble fraction", "pp_bubble_fraction", "{:.3f}"),
        ("preemptions", "preemptions_total", "{:.0f}"),
        ("simulated time (s)", "simulated_time_s", "{:.1f}"),
        ("wall time (s)", "wall_time_s", "{:.2f}")]


#: Summary keys of a mode, with their labels, when the run has them (report and compare
#: show them too): pools, speculation, prefix caching, MoE, cost, energy.
MODE_KEYS = [
    ("kv_transfer_p99_s", "KV transfer p99 (s)"), ("decode_wait_p99_s", "decode wait p99 (s)"),
    ("goodput_req_per_s_per_gpu", "goodput req/s per GPU"),
    ("acceptance_length_mean", "tokens per verification step"),
    ("spec_step_fraction", "speculative step share"),
    ("draft_time_share", "draft time share"),
    ("prefix_hit_rate", "prefix hit rate"), ("prefill_tokens_saved", "prefill tokens saved"),
    ("moe_imbalance_mean", "MoE imbalance (busiest / mean)"),
    ("moe_a2a_share", "MoE all-to-all share of step time"),
    ("cost_per_million_output_tokens_usd", "USD per million output tokens"),
    ("energy_j", "energy (J)"), ("energy_per_output_token_j", "energy per output token (J)"),
    ("power_mean_w", "mean power (W)"),
    ("autoscale_replicas_mean", "replicas (time mean)"),
    ("autoscale_gpu_hours", "GPU-hours paid"), ("autoscale_cost_usd", "cost of the run (USD)"),
    ("autoscale_scale_ups", "scale-ups"),
    ("slo_attainment_worst_window", "SLO attainment, worst window"),
    ("fairness_jain", "fairness (Jain)"),
]


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def verdict(summary: dict, requests: pd.DataFrame | None, closed_loop: bool,
            ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> str:
    """One line: whether the run keeps up with the offered load, and its SLO attainment.

    Keeping up is the planner's test (:func:`simulator.planner.simulate.keep_up`): the output
    tokens generated in the steady window over those offered by the requests arriving in
    it, at least 0.95 (less for a short window whose offered tokens scatter). A closed loop
    offers what it is served, so it always keeps up; its verdict is the attainment alone.
    """
    slo = (f"SLO attainment {summary['slo_attainment']:.1%}" if _num(
        summary.get("slo_attainment")) else "no SLO attainment (nothing completed)")
    if ttft_slo_s is not None and tpot_slo_s is not None:
        slo += f" (TTFT <= {ttft_slo_s:g} s and TPOT <= {tpot_slo_s:g} s)"
    if closed_loop:
        return f"closed loop: the clients send as fast as they are served; {slo}"
    if requests is None or requests.empty:
        return slo
    ratio, least, _ = keep_up(requests)
    t = requests["arrival_s"]
    span = float(t.max() - t.min())
    offered = f"{(len(t) - 1) / span:.3g} req/s offered" if span > 0 else "the offered load"
    if not _num(ratio):  # latencies longer than the warm-up: judge by the backlog instead
        lo, hi = backlog(requests)
        if hi > max(2 * lo, 20):
            return (f"falls behind {offered}: {hi:,} requests queued at the last arrival, "
                    f"up from {lo:,} half-way through the arrivals; {slo}")
        return f"too short to judge keeping up with {offered}; {slo}"
    if ratio >= least:
        return (f"keeps up with {offered} (generates {min(ratio, 1):.0%} of the offered "
                f"tokens in the steady window); {slo}")
    return (f"falls behind {offered}: generates {ratio:.0%} of the offered tokens in the "
            f"steady window, the queue grows; {slo}")


def steady_line(summary: dict, requests: pd.DataFrame | None) -> list[str]:
    """Where the steady window lies against the run's span (docs/metrics.md, "Steady
    figures"): the whole-run rates also hold the warm-up and the drain."""
    width = summary.get("steady_window_s")
    if requests is None or requests.empty or not _num(width) or width <= 0:
        return []
    t0 = float(requests["arrival_s"].min())
    lo = t0 + width  # the window is the second half of [t0, t1]
    return [f"  {'steady window (s)':<30} {lo:.1f} to {lo + width:.1f} (the whole-run rates "
            f"span {t0:.1f} to {summary['simulated_time_s']:.1f}: warm-up and drain "
            f"included)"]


def backlog(requests: pd.DataFrame) -> tuple[int, int]:
    """Requests arrived and not yet scheduled half-way through the arrivals and at the last
    arrival: a queue that grows means the run falls behind (the requests in service grow
    too while a system fills up, so they are not counted)."""
    t = requests["arrival_s"].to_numpy(dtype=float)
    start = requests["first_scheduled_s"].fillna(float("inf")).to_numpy(dtype=float)
    t0, t1 = float(t.min()), float(t.max())

    def waiting(at: float) -> int:
        return int(((t <= at) & (start > at)).sum())

    return waiting(0.5 * (t0 + t1)), waiting(t1)


def mode_lines(summary: dict, alerts: pd.DataFrame | None = None) -> list[str]:
    """The figures of the run's mode, those it has: each pool's busy share and the KV
    transfers, speculation, prefix caching, MoE, cost, energy, and the alerts that fired
    (cluster-wide)."""
    out, g = [], summary.get

    def row(label: str, text: str) -> None:
        out.append(f"  {label:<30} {text}")

    if _num(g("throughput_tok_per_s")) and g("gpus"):
        row("output tok/s per GPU", f"{g('throughput_tok_per_s') / g('gpus'):,.1f} "
                                    f"({g('gpus')} GPU{'s' if g('gpus') != 1 else ''})")
    if isinstance(g("pool_utilization"), dict):
        row("pools busy", ", ".join(f"{k} {v:.1%}" for k, v in g("pool_utilization").items()))
        if _num(g("kv_transfer_p99_s")):
            row("KV transfer mean / p99 (s)",
                f"{g('kv_transfer_mean_s'):.4f} / {g('kv_transfer_p99_s'):.4f} "
                f"({g('kv_transfers', 0):,} transfers)")
        if _num(g("decode_wait_p99_s")):
            row("decode wait mean / p99 (s)",
                f"{g('decode_wait_mean_s'):.4f} / {g('decode_wait_p99_s'):.4f}")
    if _num(g("acceptance_length_mean")):
        row("speculation", f"{g('acceptance_length_mean'):.2f} tokens per verification step, "
                           f"{g('spec_step_fraction'):.0%} of decode steps speculative, "
                           f"drafting {g('draft_time_share'):.1%} of busy time")
    if g("prefix_hit_rate"):
        row("prefix hit rate", f"{g('prefix_hit_rate'):.1%} of prompt tokens "
                               f"({g('prefill_tokens_saved', 0):,} prefill tokens saved)")
    if _num(g("moe_imbalance_mean")):
        row("MoE imbalance, all-to-all", f"{g('moe_imbalance_mean'):.2f} (busiest rank / "
                                         f"mean), all-to-all {g('moe_a2a_share'):.0%} of "
                                         f"step time")
    if g("autoscale_policy") is not None:  # docs/autoscaling.md
        cold = (f", cold start {g('autoscale_cold_start_mean_s'):.0f} s mean"
                if _num(g("autoscale_cold_start_mean_s")) else "")
        row("autoscaling", f"{g('autoscale_policy')}: replicas {g('autoscale_replicas_mean'):.1f}"
                           f" mean ({g('autoscale_replicas_min')} to "
                           f"{g('autoscale_replicas_max')}), {g('autoscale_scale_ups')} "
                           f"scale-ups{cold}")
        if g("autoscale_scale_ups_capped"):
            row("scale-ups capped", f"{g('autoscale_scale_ups_capped')} decisions wanted up "
                f"to {g('autoscale_capped_wanted_max')} replicas, more than there are to "
                f"start (max_replicas or the cluster's nodes), the first at t = "
                f"{g('autoscale_capped_first_s'):,.0f} s")
        row("GPU-hours paid", f"{g('autoscale_gpu_hours'):,.1f} (${g('autoscale_cost_usd'):,.0f})"
            if _num(g("autoscale_cost_usd")) else f"{g('autoscale_gpu_hours'):,.1f}")
        per = g("autoscale_pool_replicas_mean") or {}
        if per:  # disaggregated: each pool's replicas and GPU-hours
            lo, hi = g("autoscale_pool_replicas_min"), g("autoscale_pool_replicas_max")
            hours = g("autoscale_pool_gpu_hours")
            row("replicas per pool", "; ".join(
                f"{n} {m:.1f} mean ({lo[n]} to {hi[n]}), {hours[n]:,.2f} GPU-hours"
                for n, m in per.items()))
        if g("autoscale_requests_in_cold_starts"):
            row("arrived during cold starts", f"{g('autoscale_requests_in_cold_starts'):,} "
                f"requests, {g('autoscale_cold_start_slo_attainment'):.1%} within the SLOs")
        if _num(g("slo_attainment_worst_window")):
            row("SLO attainment, worst window", f"{g('slo_attainment_worst_window'):.1%} (the "
                f"{g('slo_window_s'):g} s from t = {g('slo_attainment_worst_window_start_s'):,.0f}"
                f" s; {g('slo_attainment'):.1%} over the run)")
    classes = [k.removeprefix("class_").removesuffix("_slo_attainment") for k in summary
               if k.startswith("class_") and k.endswith("_slo_attainment")]
    if classes:  # the gateway's request classes (docs/gateway.md)
        row("classes: SLO attainment", ", ".join(
            f"{c} {g(f'class_{c}_slo_attainment'):.1%}"
            + (f" (shed {g(f'class_{c}_shed'):,}, expired {g(f'class_{c}_expired'):,})"
               if g(f"class_{c}_shed") or g(f"class_{c}_expired") else "")
            for c in classes))
        if _num(g("fairness_jain")):
            row("fairness (Jain, tenants)", f"{g('fairness_jain'):.3f}")
    cost = g("cost_per_million_tokens_usd", g("cost_per_million_output_tokens_usd"))
    if _num(cost):
        price = (f" at ${g('gpu_hour_usd'):.2f} per GPU-hour" if _num(g("gpu_hour_usd"))
                 else "")
        row("cost per million output tok", f"${cost:.2f}{price}")
    if _num(g("energy_j")):
        row("energy", f"{g('energy_j') / 1e6:.3g} MJ, {g('energy_per_output_token_j'):.3g} J "
                      f"per output token, mean power {g('power_mean_w') / 1e3:.3g} kW")
    if alerts is not None and not alerts.empty:
        fired = alerts[(alerts["replica"].astype(str) == "all") & (alerts["event"] == "fire")]
        if not fired.empty:
            by = fired.groupby("rule", sort=False)["time_s"]
            row("alerts fired (cluster)", ", ".join(
                f"{rule} x{n} (first at {t:g} s)"
                for rule, n, t in zip(by.size().index, by.size(), by.min(), strict=True)))
        else:
            row("alerts fired (cluster)", "none (per replica only: see alerts.csv)")
    return out


def format_summary(name: str, summary: dict, requests: pd.DataFrame | None = None,
                   alerts: pd.DataFrame | None = None, verdict_line: str | None = None
                   ) -> str:
    """The run's printout: the verdict (when given), the ROWS, the figures of its mode
    (:func:`mode_lines`), then what did not go as asked (requests not completed and why,
    replica outages, retries) when there is any."""
    lines = [f"scenario {name}"]
    if verdict_line:
        lines.append(f"  {'verdict':<30} {verdict_line}")
    for label, first, fmt, *rest in ROWS:
        values = " / ".join(fmt.format(summary[k]) for k in (first, *rest))
        lines.append(f"  {label:<30} {values}")
        if first == "throughput_steady_tok_per_s":
            lines += steady_line(summary, requests)
    return "\n".join(lines + mode_lines(summary, alerts) + trouble_lines(summary, requests))


def trouble_lines(summary: dict, requests: pd.DataFrame | None = None) -> list[str]:
    """Rejected / dropped / failed counts with their commonest reason, availability,
    retries and each outage, only when not trivial."""
    out = []
    for status, key in (("rejected", "requests_rejected"), ("dropped", "requests_dropped"),
                        ("failed_after_retries", "requests_failed")):
        n = summary.get(key, 0)
        if not n:
            continue
        why = ""
        if requests is not None:
            reasons = requests.loc[requests["status"] == status, "reason"].value_counts()
            if len(reasons):
                more = f" (+{len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
                why = f": {reasons.index[0]}{more}"
        out.append(f"  {'requests ' + status:<30} {n}{why}")
    if summary.get("availability_min", 1.0) < 1.0:
        out.append(f"  {'availability mean / min':<30} {summary['availability_mean']:.3f} / "
                   f"{summary['availability_min']:.3f}")
    if summary.get("retries_total", 0):
        out.append(f"  {'retries':<30} {summary['retries_total']}")
    for replica, down, up, cause in summary.get("downtime_spans", []):
        back = f"up again at {up:.1f} s" if up is not None else "never back"
        out.append(f"  {'replica ' + str(replica) + ' down':<30} at {down:.1f} s ({cause} "
                   f"failed), {back}")
    return out
