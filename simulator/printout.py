"""What the CLI prints about a run: the summary rows, then what did not go as asked
(requests not completed and why, outages and the faults behind them, retries)."""

from __future__ import annotations

import pandas as pd

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


def format_summary(name: str, summary: dict, requests: pd.DataFrame | None = None) -> str:
    """The run's printout: the ROWS, then what did not go as asked (requests not completed
    and why, replica outages, retries) when there is any."""
    lines = [f"scenario {name}"]
    for label, first, fmt, *rest in ROWS:
        values = " / ".join(fmt.format(summary[k]) for k in (first, *rest))
        lines.append(f"  {label:<30} {values}")
    return "\n".join(lines + trouble_lines(summary, requests))


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
