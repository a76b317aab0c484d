"""Plots of runs and sweeps: matplotlib functions ``(data, ..., ax=None) -> Axes``.

Used by ``python -m simulator plot`` and importable in notebooks. Nothing here computes a
metric: the data come from the run's tables (requests, steps, timeseries, alerts). Importing
this module never changes the caller's matplotlib backend: the functions given no ``ax``
draw with pyplot (so a notebook shows them inline), and the file writers
(:func:`run_report`, :func:`save_sweep_plot`) draw on bare :class:`~matplotlib.figure.Figure`
objects, which need no backend and open no window.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simulator.files import out_files
from simulator.io import runfolder
from simulator.metrics.measured import THROUGHPUTS, label
from simulator.plaintext import plain_text

LABELS = {"ttft_s": "TTFT (s)", "tpot_s": "TPOT (s)", "e2e_s": "end-to-end latency (s)"}
#: Readable legend entries for timeseries columns (kv_util_rN becomes "replica N").
SERIES = {"output_tok_per_s": "output tokens/s (as generated)", "queue_len": "queued",
          "running": "running", "arrivals": "arrivals", "completions": "completions",
          "ttft_p99_s": "TTFT p99", "ttft_p50_s": "TTFT p50", "tpot_p99_s": "TPOT p99",
          "tpot_p50_s": "TPOT p50", "e2e_p99_s": "E2E p99", "e2e_p50_s": "E2E p50",
          "waiting_ttft_max_s": "oldest waiting for a first token",
          "oldest_queued_s": "oldest queued", "batch_efficiency": "batch fill"}
NO_STEPS = "no per-step records in this run\n(run without --no-steps to see this panel)"


def read_table(run_dir: str | Path, stem: str) -> pd.DataFrame | None:
    """A run folder's table ``stem`` (requests, steps, timeseries, gpu_timeseries, alerts)
    from its CSV or Parquet file, checked (:func:`simulator.io.runfolder.read_table`);
    None when the run wrote neither."""
    return runfolder.read_table(run_dir, stem)


def _ax(ax):
    return ax if ax is not None else plt.subplots(figsize=(6, 4))[1]


#: Axis labels of sweep keys and summary metrics (other keys: :func:`axis_label`'s rules).
AXES = {"workload.rate_per_s": "offered rate (requests/s)",
        "workload.concurrency": "closed-loop clients", "parallel.tp": "tensor parallel (TP)",
        "parallel.pp": "pipeline stages (PP)", "parallel.dp": "data-parallel replicas (DP)",
        "ttft_p99_s": "TTFT p99 (s)", "ttft_p50_s": "TTFT p50 (s)",
        "ttft_mean_s": "TTFT mean (s)", "tpot_p99_s": "TPOT p99 (s)",
        "tpot_p50_s": "TPOT p50 (s)", "tpot_mean_s": "TPOT mean (s)",
        "e2e_p99_s": "end-to-end p99 (s)", "throughput_tok_per_s": "output tokens/s (run)",
        "throughput_steady_tok_per_s": "output tokens/s (steady window)",
        "goodput_req_per_s": "goodput (requests/s, run)",
        "goodput_steady_req_per_s": "goodput (requests/s, steady window)",
        "slo_attainment": "SLO attainment", "engine.max_num_seqs": "max_num_seqs",
        "cost_per_million_output_tokens_usd": "USD per million output tokens"}


def axis_label(key: str) -> str:
    """A readable axis label for a sweep key or a summary column: the known ones by name,
    others with their unit suffix spelled out (``_s`` -> "(s)", ``_per_s`` -> "(/s)")."""
    if key in AXES:
        return AXES[key]
    name = key.rsplit(".", 1)[-1]
    for suffix, unit in (("_tok_per_s", " (tokens/s)"), ("_req_per_s", " (requests/s)"),
                         ("_per_s", " (/s)"), ("_usd", " (USD)"), ("_j", " (J)"),
                         ("_w", " (W)"), ("_s", " (s)")):
        if name.endswith(suffix):
            return name.removesuffix(suffix).replace("_", " ") + unit
    return name.replace("_", " ")


def series_label(column: str) -> str:
    if column.startswith("kv_util_r"):
        return f"replica {column.removeprefix('kv_util_r')}"
    return SERIES.get(column, column)


def empty_note(ax, text: str):
    """Say why a panel is empty instead of leaving a blank frame."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])
    return ax


def cdf(requests: pd.DataFrame, metric: str = "ttft_s", slo: float | None = None,
        ax=None, label: str | None = None):
    """Empirical CDF of a per-request latency (completed requests), with the SLO as a
    vertical line; a log x axis when the values span more than two decades."""
    ax = _ax(ax)
    done = requests[requests["status"] == "completed"] if "status" in requests else requests
    v = np.sort(done[metric].dropna().to_numpy())
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)
    if slo:
        ax.axvline(slo, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    ax.set_xlabel(LABELS.get(metric, metric))
    ax.set_ylabel("fraction of completed requests")
    ax.set_ylim(0, 1.01)
    positive = v[v > 0]
    if len(positive) and positive[-1] / positive[0] > 100:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    return ax


def mark_faults(ts: pd.DataFrame, ax) -> None:
    """Shade the windows in which some replica was down (``replicas_down`` > 0)."""
    if "replicas_down" not in ts or not (ts["replicas_down"] > 0).any():
        return
    for start, end, down in zip(ts["window_start_s"], ts["window_end_s"], ts["replicas_down"],
                                strict=True):
        if down > 0:
            ax.axvspan(start, end, color="orange", alpha=0.15, linewidth=0)
    ax.fill_between([], [], color="orange", alpha=0.15, label="replica down")


def legend_outside(ax, fontsize: float = 7):
    """The axes' legend to the right of its frame, where it covers no data (the figure's
    tight layout makes room for it); nothing when nothing is labelled."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0)
    return ax


def over_time(ts: pd.DataFrame, columns: list[str], alerts: pd.DataFrame | None = None,
              ax=None, ylabel: str = "", name_alerts: bool = True):
    """Window columns against time; alert firings as red lines (each named by its rule at
    the top of the panel when ``name_alerts``), faults shaded; the legend outside."""
    ax = _ax(ax)
    t = ts["window_start_s"].to_numpy()
    for c in columns:
        if c in ts:
            ax.plot(t, ts[c].to_numpy(), label=series_label(c), linewidth=1)
    mark_faults(ts, ax)
    if alerts is not None and not alerts.empty:
        fired = alerts[(alerts["event"] == "fire") & (alerts["replica"].astype(str) == "all")]
        for when, rule in zip(fired["time_s"], fired["rule"], strict=True):
            ax.axvline(when, color="red", alpha=0.4, linewidth=1)
            if name_alerts:
                ax.text(when, 0.98, f" {rule}", transform=ax.get_xaxis_transform(),
                        rotation=90, va="top", ha="right", fontsize=6, color="darkred")
        if not fired.empty:
            ax.plot([], [], color="red", alpha=0.4, label="alert fired")
    ax.set_xlabel("time (s)")
    ax.tick_params(labelbottom=True)  # every panel of a shared-x figure reads its time
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return legend_outside(ax)


def pipeline_gantt(steps: pd.DataFrame, until_s: float | None = None, ax=None,
                   max_replicas: int = 4):
    """Each replica stage as a lane, each step as a bar (prefill darker): the white gaps
    between bars are the pipeline bubbles."""
    ax = _ax(ax)
    if steps.empty:
        return empty_note(ax, NO_STEPS)
    t0 = steps["start_s"].min()
    until = t0 + (until_s if until_s is not None else 2.0)
    s = steps[(steps["start_s"] < until) & (steps["replica"] < max_replicas)]
    lanes = sorted({(r, st) for r, st in zip(s["replica"], s["stage"], strict=True)})
    for y, (r, st) in enumerate(lanes):
        g = s[(s["replica"] == r) & (s["stage"] == st)]
        spans = list(zip(g["start_s"], g["end_s"] - g["start_s"], strict=True))
        colors = np.where(g["prefill_tokens"] > 0, "tab:orange", "tab:blue")
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colors)
    ax.set_yticks(range(len(lanes)), [f"replica {r} stage {st}" for r, st in lanes])
    ax.set_xlim(t0, until)
    ax.set_xlabel("time (s)")
    ax.set_title("steps per replica stage (orange: with prefill; gaps: bubbles)")
    return ax


def gpu_heatmap(gpu_ts: pd.DataFrame, value: str = "compute_util", ax=None):
    """Utilization per GPU (rows) over windows (columns)."""
    ax = _ax(ax)
    if gpu_ts.empty:
        return empty_note(ax, NO_STEPS)
    grid = gpu_ts.pivot_table(index="gpu", columns="window_start_s", values=value)
    im = ax.imshow(grid.to_numpy(), aspect="auto", interpolation="nearest", vmin=0,
                   vmax=max(1e-9, float(np.nanmax(grid.to_numpy()))), cmap="viridis",
                   extent=(grid.columns.min(), grid.columns.max(), len(grid) - 0.5, -0.5))
    ax.figure.colorbar(im, ax=ax, label=value.replace("_", " "))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("GPU")
    return ax


def swept_keys(df: pd.DataFrame) -> list[str]:
    """The swept keys of a sweep table: the columns between ``run_id`` and ``seed``."""
    cols = list(df.columns)
    if "run_id" in cols and "seed" in cols:
        return cols[cols.index("run_id") + 1:cols.index("seed")]
    return []


def sweep_plot(df: pd.DataFrame, x: str, y: str, hue: str | None = None, ax=None):
    """A metric of a sweep against a swept key: one line per value of every other swept key
    (``hue`` first in the label), the mean over seeds as the point and the seeds' range
    (min to max) as its error bar. Nothing is averaged over a swept key."""
    ax = _ax(ax)
    ok = df[df["status"] == "ok"] if "status" in df else df
    others = [k for k in swept_keys(df) if k != x]
    if hue and hue in others:
        others.remove(hue)
        others.insert(0, hue)
    elif hue and hue != x:
        others.insert(0, hue)
    groups = ok.groupby(others, dropna=False) if others else [((), ok)]
    seeds = int(ok.groupby([x, *others], dropna=False).size().max()) if len(ok) else 0
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        stats = g.groupby(x)[y].agg(["mean", "min", "max"]).sort_index()
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(others, key, strict=True)
                          ) or None
        ax.errorbar(stats.index, stats["mean"],
                    yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
                    marker="o", capsize=3, label=label)
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y) + (f"\n(mean of {seeds} seeds; bars: min to max)"
                                   if seeds > 1 else ""))
    ax.grid(alpha=0.3)
    if others:
        legend_outside(ax, 8)
    return ax


@plain_text
def save_sweep_plot(df: pd.DataFrame, x: str, y: str, hue: str | None, path: Path) -> Path:
    """:func:`sweep_plot` into a PNG (no pyplot, no window)."""
    fig = Figure(figsize=(7, 4.5))
    sweep_plot(df, x, y, hue, fig.add_subplot())
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def autoscaling(ts: pd.DataFrame, ax=None, capacity_per_s: float | None = None):
    """The offered load (arrivals per second, per window) and the replicas paid for
    (starting, serving or draining: the ``replicas`` column) on one time axis; with
    ``capacity_per_s`` (one replica's within the SLOs, ``autoscale_replica_capacity_per_s``)
    also the capacity paid for, replicas x capacity, in the load's units."""
    ax = _ax(ax)
    t = ts["window_end_s"].to_numpy(dtype=float)
    width = np.diff(np.concatenate(([0.0], t)))
    rate = ts["arrivals"].to_numpy(dtype=float) / np.where(width > 0, width, 1.0)
    ax.plot(t, rate, color="0.45", linewidth=0.8, label="arrivals per second")
    if capacity_per_s is not None and np.isfinite(capacity_per_s):
        ax.step(t, ts["replicas"].to_numpy(dtype=float) * capacity_per_s, where="post",
                color="C1", linewidth=1.0, linestyle="--",
                label=f"capacity paid for (replicas x {capacity_per_s:.3g} req/s)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("arrivals per second")
    right = ax.twinx()
    right.step(t, ts["replicas"].to_numpy(), where="post", color="C0", linewidth=1.6,
               label="replicas paid for")
    pools = [c for c in ts.columns if c.startswith("replicas_pool_")]
    for k, col in enumerate(pools):  # disaggregated: each pool's replicas
        right.step(t, ts[col].to_numpy(), where="post", color=f"C{k + 2}", linewidth=1.0,
                   label=f"replicas, pool {col.removeprefix('replicas_pool_')}")
    right.set_ylabel("replicas")
    right.set_ylim(0, max(1, ts["replicas"].max()) * 1.15)
    lines = ax.get_lines() + right.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], loc="upper left",
              bbox_to_anchor=(0.0, -0.18), ncol=2, frameon=False)
    return ax


@plain_text
def run_figures(run_dir: str | Path) -> dict[str, Figure]:
    """Every figure of a run directory, by file stem, on bare Figures."""
    run = Path(run_dir)
    requests = read_table(run, "requests")
    name, slo = runfolder.read_meta(run)
    figs = {}
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    cdf(requests, "ttft_s", slo.get("ttft_s"), axes[0])
    cdf(requests, "tpot_s", slo.get("tpot_s"), axes[1])
    cdf(requests, "e2e_s", None, axes[2])
    for a in axes:
        legend_outside(a, 8)
    fig.suptitle(f"{name}: latency of completed requests")
    figs["latency_cdf"] = fig
    ts = read_table(run, "timeseries")
    if ts is not None:
        al = read_table(run, "alerts")
        # The KV panel needs per-step records; without them the figure has three panels.
        kv = [c for c in ts.columns if c.startswith("kv_util_r")][:16]
        fig = Figure(figsize=(11, 12 if kv else 9.5))
        axes = fig.subplots(4 if kv else 3, 1, sharex=True)
        over_time(ts, ["output_tok_per_s"], al, axes[0], "output tokens/s")
        over_time(ts, ["queue_len", "running"], al, axes[1], "requests", name_alerts=False)
        over_time(ts, ["ttft_p99_s", "tpot_p99_s", "waiting_ttft_max_s"], al, axes[2],
                  "seconds", name_alerts=False)
        axes[2].set_yscale("symlog", linthresh=0.01)
        if kv:
            over_time(ts, kv, al, axes[3], "KV cache utilization", name_alerts=False)
        fig.suptitle(f"{name}: over time (red: alert fired, named at the top; orange: a "
                     f"replica down)" + ("" if kv else "; no KV panel: no per-step records"))
        figs["timeseries"] = fig
        if "replicas" in ts:  # autoscaling (docs/autoscaling.md)
            fig = Figure(figsize=(11, 4))
            cap = runfolder.read_summary(run).get("autoscale_replica_capacity_per_s")
            autoscaling(ts, fig.add_subplot(),
                        cap if isinstance(cap, (int, float)) else None)
            fig.suptitle(f"{name}: load, capacity and replicas (autoscaling)")
            figs["autoscaling"] = fig
        if "prefix_hit_rate" in ts and ts["prefix_hit_rate"].fillna(0).gt(0).any():
            fig = Figure(figsize=(10, 3))  # prefix caching (docs/prefix-caching.md)
            over_time(ts, ["prefix_hit_rate"], al, fig.add_subplot(), "prefix hit rate (tokens)")
            fig.suptitle(f"{name}: prefix cache hit rate")
            figs["prefix_hit_rate"] = fig
    steps = read_table(run, "steps")
    if steps is not None and not steps.empty:  # not drawn without per-step records
        fig = Figure(figsize=(12, 4))
        pipeline_gantt(steps, 2.0, fig.add_subplot())
        fig.suptitle(name)
        figs["pipeline_gantt"] = fig
    gts = read_table(run, "gpu_timeseries")
    if gts is not None and not gts.empty:  # from the steps, or folded per window
        fig = Figure(figsize=(10, 5))
        gpu_heatmap(gts, "compute_util", fig.add_subplot())
        fig.suptitle(f"{name}: GPU compute utilization")
        figs["gpu_heatmap"] = fig
    return figs


#: The figures that need per-step records (or, for the heat map, folded step windows).
STEP_FIGURES = ("pipeline_gantt", "gpu_heatmap")


def run_report(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Every plot of a run directory as PNGs in ``out_dir`` (default: the run directory)."""
    figs = run_figures(run_dir)
    paths = out_files(out_dir or run_dir, [f"{stem}.png" for stem in figs], "plot --out")
    return [_save(fig, path) for fig, path in zip(figs.values(), paths, strict=True)]


def measured_vs_simulated(table: pd.DataFrame, path: Path) -> Path:
    """``compare --measured``: each latency figure measured and simulated (ms, log scale)
    beside the signed error of every figure (%); ``table`` from
    :func:`simulator.metrics.measured.comparison`."""
    lat = table[~table["metric"].isin(list(THROUGHPUTS))]
    fig = Figure(figsize=(11, max(3.0, 0.32 * len(table) + 1.2)))
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    labels = [label(m)[0] for m in lat["metric"]]
    y = np.arange(len(lat))
    left.barh(y - 0.2, lat["measured"] * 1e3, height=0.4, label="measured", color="0.55")
    left.barh(y + 0.2, lat["simulated"] * 1e3, height=0.4, label="simulated", color="C0")
    left.set_yticks(y, labels)
    left.invert_yaxis()
    left.set_xscale("log")
    left.set_xlabel("latency (ms, log scale)")
    left.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    names = [f"{name} ({unit})" for name, _, unit in map(label, table["metric"])]
    err = table["error_pct"].to_numpy(dtype=float)
    yy = np.arange(len(table))
    right.barh(yy, np.nan_to_num(err), color=np.where(err > 0, "C3", "C0"))
    right.axvline(0, color="0.3", linewidth=0.8)
    reach = np.nanmax(np.abs(err), initial=1.0) * 1.4  # room for the labels on both sides
    right.set_xlim(-reach, reach)
    right.set_yticks(yy, names)
    right.invert_yaxis()
    right.set_xlabel("simulated - measured (% of measured)")
    for i, e in enumerate(err):
        if np.isfinite(e):
            right.annotate(f"{e:+.1f}%", (e, i), xytext=(3 if e >= 0 else -3, 0),
                           textcoords="offset points", va="center",
                           ha="left" if e >= 0 else "right", fontsize=8)
    fig.suptitle("measured vs simulated")
    return _save(fig, path)
