"""Shared printing for the benchmark scripts: one line per figure, units in the label."""

from __future__ import annotations


def print_run(summary: dict, wall_s: float, extra: dict | None = None) -> None:
    """Figures of one simulation run: size, simulated and wall time, rates, latencies."""
    s = summary
    rows = {
        "requests": f"{s['requests_total']:,} ({s['requests_completed']:,} completed)",
        "replica steps": f"{s['steps_total']:,}",
        "simpy events": f"{s['simpy_events']:,}",
        "simulated time": f"{s['simulated_time_s']:,.1f} s",
        "wall time": f"{wall_s:.2f} s",
        "requests per wall-s": f"{s['requests_total'] / wall_s:,.0f}",
        "steps per wall-s": f"{s['steps_total'] / wall_s:,.0f}",
        "TTFT p50 / p99": f"{s['ttft_p50_s']:.3f} / {s['ttft_p99_s']:.3f} s",
        "TPOT p50 / p99": f"{s['tpot_p50_s']:.4f} / {s['tpot_p99_s']:.4f} s",
        **(extra or {}),
    }
    for label, value in rows.items():
        print(f"{label:<21}{value}")
