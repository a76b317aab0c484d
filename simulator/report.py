"""One run as one shareable file, and runs side by side.

``report RUN_DIR`` writes ``RUN_DIR/report.html``: the summary, the alert events, every
plot of the run (PNG embedded as base64, so the file needs nothing beside it) and the
resolved scenario. ``compare RUN_A RUN_B ...`` prints a table of summary figures with each
run's difference from the first, and writes it as ``compare.csv`` with ``compare_cdf.png``
(the latency CDFs of every run overlaid). Both read only the files a run wrote.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simulator import files
from simulator.errors import ScenarioError
from simulator.files import out_file
from simulator.io.runfolder import read_summary
from simulator.metrics.day import worst_window
from simulator.metrics.pools import flat_pool_metrics
from simulator.plaintext import plain_text
from simulator.plotting import cdf, legend_outside, read_table, run_figures
from simulator.printout import MODE_KEYS, verdict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Summary figures a report and a comparison show first, with their labels.
HEADLINE = [
    ("requests_total", "requests"), ("requests_completed", "completed"),
    ("requests_rejected", "rejected"), ("requests_dropped", "dropped"),
    ("requests_failed", "failed after retries"), ("slo_attainment", "SLO attainment"),
    ("ttft_p50_s", "TTFT p50 (s)"), ("ttft_p99_s", "TTFT p99 (s)"),
    ("tpot_p50_s", "TPOT p50 (s)"), ("tpot_p99_s", "TPOT p99 (s)"),
    ("e2e_p99_s", "E2E p99 (s)"), ("queue_p99_s", "queue p99 (s)"),
    ("throughput_tok_per_s", "output tok/s (whole run)"),
    ("throughput_steady_tok_per_s", "output tok/s (steady)"),
    ("goodput_req_per_s", "goodput req/s (whole run)"),
    ("goodput_steady_req_per_s", "goodput req/s (steady)"),
    ("preemptions_total", "preemptions"), ("pp_bubble_fraction", "pipeline bubble"),
    ("availability_min", "availability (worst replica)"), ("retries_total", "retries"),
    ("gpus", "GPUs"), ("simulated_time_s", "simulated time (s)"),
    ("throughput_tok_per_s_per_gpu", "output tok/s per GPU"),
    *MODE_KEYS,
]


MODE = {k for k, _ in MODE_KEYS}


def _with_derived(summary: dict) -> dict:
    """The summary with the per-GPU throughput and one ``pool_utilization_<pool>`` key per
    pool (what ``compare`` lines up across runs)."""
    out = dict(summary)
    tok, gpus = summary.get("throughput_tok_per_s"), summary.get("gpus")
    if isinstance(tok, (int, float)) and gpus:
        out["throughput_tok_per_s_per_gpu"] = tok / gpus
    return out | flat_pool_metrics(summary)


def read_run(run_dir: str | Path) -> tuple[dict, pd.DataFrame]:
    """A run folder's summary and request table.

    Raises
    ------
    ScenarioError
        When the folder lacks summary.json or requests.csv (not a run folder).
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ScenarioError(f"{str(run)!r} is not a run folder (not a folder); give a folder "
                            f"written by `python -m simulator run`")
    there = (run / "summary.json").exists() or (run / "summary.json").is_symlink()
    requests = read_table(run, "requests")
    missing = [f for f, ok in (("summary.json", there), ("requests.csv", requests is not None))
               if not ok]
    if missing:
        raise ScenarioError(f"{str(run)!r} is not a run folder (no {', '.join(missing)}); "
                            f"give a folder written by `python -m simulator run`")
    return read_summary(run), requests


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    return base64.b64encode(buf.getvalue()).decode()


def _fmt(value) -> str:
    """A figure as text: counts as integers with thousands separators (19,366), large
    values to the unit (12,345), others to four significant digits."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()
                                  and abs(value) >= 1000):
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return html.escape(json.dumps(value) if isinstance(value, (list, dict)) else str(value))


def run_scenario(run: Path) -> dict:
    """A run folder's resolved scenario.toml as a dict ({} when it has none)."""
    path = run / "scenario.toml"
    there = path.exists() or path.is_symlink()
    try:  # through the input layer: a run folder may hold anything
        sc = tomllib.loads(files.read_text(path, "run folder")) if there else {}
    except tomllib.TOMLDecodeError:
        raise ScenarioError(f"run folder: {files.excerpt(str(path), 80)} is not a "
                            f"scenario.toml the simulator wrote (not valid TOML)") from None
    return sc if isinstance(sc, dict) else {}


def run_header(run: Path, summary: dict, requests: pd.DataFrame) -> tuple[str, list[str]]:
    """A run's title (model on cluster, scenario name) and its header lines: model,
    cluster, layout, and the verdict (:func:`simulator.printout.verdict`), read from the
    run's scenario.toml."""
    sc = run_scenario(run)
    name = sc.get("name") or run.name
    model = sc.get("model", {}).get("name", "?")
    cluster, par, pools = sc.get("cluster", {}), sc.get("parallel", {}), sc.get("pools", [])
    nodes = f"{cluster.get('nodes', '?')} x {cluster.get('topology', '?')}"
    if pools:
        nodes = " + ".join(f"{p.get('nodes', 1)} x {p.get('topology') or cluster.get('topology')}"
                           for p in pools if not p.get("same_nodes_as"))
        layout = ", ".join(f"{p.get('name')} ({p.get('role')}) TP{p.get('tp', 1)} "
                           f"PP{p.get('pp', 1)} DP{p.get('dp', 1)}" for p in pools)
    else:
        layout = f"TP{par.get('tp', 1)} PP{par.get('pp', 1)} DP{par.get('dp', 1)}"
        if (par.get("ep") or 1) > 1:
            layout += f" EP{par['ep']}"
    slo, w = sc.get("slo", {}), sc.get("workload", {})
    line = verdict(summary, requests, w.get("arrival") == "closed_loop", slo.get("ttft_s"),
                   slo.get("tpot_s"))
    gpus = summary.get("gpus")
    return (f"{model} on {nodes}: {name}",
            [f"model {model} ({sc.get('model', {}).get('weight_dtype', 'bf16')} weights)",
             f"cluster {nodes}" + (f", {gpus} GPUs used" if gpus else ""),
             f"layout {layout}", f"verdict: {line}"])


CSS = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
       "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
       "padding:2px 8px;text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}"
       "img{max-width:100%}pre{background:#f7f7f7;padding:1em;font-size:12px;overflow:auto}")


def html_report(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report.html`` (self-contained) and return its path."""
    run = Path(run_dir)
    summary, requests = read_run(run)
    out = out_file(run / "report.html", "report")  # checked before drawing anything
    there = (run / "scenario.toml").exists() or (run / "scenario.toml").is_symlink()
    scenario = files.read_text(run / "scenario.toml", "run folder") if there else ""
    title, header = run_header(run, summary, requests)
    summary = _with_derived(summary)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             "<ul class='header'>", *(f"<li>{html.escape(h)}</li>" for h in header), "</ul>",
             f"<p>{html.escape(str(run))}: {len(requests):,} requests.</p>",
             "<h2>Summary</h2>", "<table><tr><th>metric</th><th>value</th></tr>"]
    shown = {k for k, _ in HEADLINE}
    for key, label in HEADLINE:
        if key in summary:
            parts.append(f"<tr><td>{label}</td><td>{_fmt(summary[key])}</td></tr>")
    parts.append("</table><details><summary>every summary key</summary><table>")
    for key, value in summary.items():
        if key not in shown:
            parts.append(f"<tr><td>{html.escape(str(key))}</td><td>{_fmt(value)}</td></tr>")
    parts.append("</table></details><h2>Alerts</h2>")
    alerts = read_table(run, "alerts")
    if alerts is None or alerts.empty:
        parts.append("<p>No alert fired.</p>")
    else:
        cluster = alerts[alerts["replica"].astype(str) == "all"]
        parts.append(f"<p>{len(alerts)} events, {len(cluster)} cluster-wide (shown; the "
                     f"per-replica ones are in alerts.csv).</p>")
        parts.append(cluster.to_html(index=False, float_format=lambda v: f"{v:.4g}"))
    parts.append("<h2>Plots</h2>")
    for stem, fig in run_figures(run).items():
        parts.append(f"<h3>{stem}</h3><img alt='{stem}' src='data:image/png;base64,"
                     f"{_png(fig)}'>")
    parts.append(f"<h2>Scenario</h2><pre>{html.escape(scenario)}</pre></body></html>")
    out.write_text("\n".join(parts))
    return out


def compare_table(runs: list[str | Path]) -> pd.DataFrame:
    """One row per headline figure: each run's value, then each later run's difference from
    the first (absolute and relative)."""
    if len(runs) < 2:
        raise ScenarioError("compare: give at least two run folders")
    summaries = [_with_derived(read_run(r)[0]) for r in runs]
    pools = [k for s in summaries for k in s if k.startswith("pool_utilization_")]
    return _table(summaries, _names(runs), [*HEADLINE, *((k, f"busy share of pool {k[17:]}")
                                                         for k in dict.fromkeys(pools))])


def _table(summaries: list[dict], names: list[str], keys: list[tuple[str, str]]
           ) -> pd.DataFrame:
    """One row per (key, label) of ``keys`` shown by some run: each run's value, then each
    later run's difference from the first (absolute and relative)."""
    rows = []
    for key, label in keys:
        if not any(_shown(s.get(key)) and (s.get(key) or key not in MODE)
                   for s in summaries):
            continue  # a mode figure that is absent or zero in every run is not a mode
        values = [s.get(key) for s in summaries]
        row = {"metric": key, "label": label, **dict(zip(names, values, strict=True))}
        base = values[0]
        for name, v in zip(names[1:], values[1:], strict=True):
            ok = isinstance(base, (int, float)) and isinstance(v, (int, float))
            row[f"{name} - {names[0]}"] = v - base if ok else None
            row[f"{name} vs {names[0]} (%)"] = (100 * (v - base) / abs(base)
                                                if ok and base else None)
        rows.append(row)
    return pd.DataFrame(rows)


#: The figures ``compare --day`` lines up: what a day cost and how well it was served.
DAY = [("requests_total", "requests"), ("slo_attainment", "SLO attainment"),
       ("slo_attainment_worst_window", "SLO attainment, worst window"),
       ("slo_attainment_worst_window_start_s", "worst window starts at (s)"),
       ("ttft_p99_s", "TTFT p99 (s)"), ("tpot_p99_s", "TPOT p99 (s)"),
       ("day_replicas_mean", "replicas (time mean)"), ("day_replicas_max", "replicas (most)"),
       ("day_gpu_hours", "GPU-hours paid"), ("day_cost_usd", "cost (USD)"),
       ("cost_per_million_output_tokens_usd", "USD per million output tokens"),
       ("energy_j", "energy (J, whole fleet)"), ("day_cold_starts", "cold starts"),
       ("autoscale_cold_start_mean_s", "cold start mean (s)"),
       ("autoscale_requests_in_cold_starts", "requests arrived during cold starts"),
       ("autoscale_cold_start_slo_attainment", "their SLO attainment")]


def day_figures(run: str | Path, window_s: float | None = None) -> dict:
    """What a day cost, for an autoscaled run and a static one alike: replicas, GPU-hours
    and cost paid (a static run pays every GPU for the whole run, ``gpus x simulated
    time``), cold starts (none for a static run) and the worst window's SLO attainment
    over windows of ``window_s`` (None: the run's own ``slo_window_s``, which only an
    autoscaled run has)."""
    run = Path(run)
    summary, requests = read_run(run)
    out = dict(summary)
    hours = (summary.get("simulated_time_s") or 0.0) / 3600.0
    gpus = summary.get("gpus") or 0
    price = summary.get("gpu_hour_usd")
    if "autoscale_gpu_hours" in summary:
        out["day_gpu_hours"] = summary["autoscale_gpu_hours"]
        out["day_cost_usd"] = summary.get("autoscale_cost_usd")
        out["day_replicas_mean"] = summary.get("autoscale_replicas_mean")
        out["day_replicas_max"] = summary.get("autoscale_replicas_max")
        out["day_cold_starts"] = summary.get("autoscale_scale_ups")
    else:
        sc = run_scenario(run)
        pools = sc.get("pools") or []
        replicas = (sum(p.get("dp", 1) for p in pools) if pools
                    else sc.get("parallel", {}).get("dp"))
        out["day_gpu_hours"] = gpus * hours
        out["day_cost_usd"] = gpus * hours * price if isinstance(price, (int, float)) else None
        out["day_replicas_mean"] = out["day_replicas_max"] = replicas
        out["day_cold_starts"] = 0
        for p in pools:  # a static pool pays its GPUs for the whole run
            name = p.get("name")
            out[f"day_replicas_mean_pool_{name}"] = p.get("dp", 1)
            out[f"day_gpu_hours_pool_{name}"] = (summary.get("pool_gpus") or {}).get(
                name, math.nan) * hours
    for name, v in (summary.get("autoscale_pool_replicas_mean") or {}).items():
        out[f"day_replicas_mean_pool_{name}"] = v
    for name, v in (summary.get("autoscale_pool_gpu_hours") or {}).items():
        out[f"day_gpu_hours_pool_{name}"] = v
    window = window_s or summary.get("slo_window_s")
    if window and (window_s or "slo_attainment_worst_window" not in summary):
        slo = run_scenario(run).get("slo", {})
        out.update(worst_window(requests, float(window), float(slo.get("ttft_s", 2.0)),
                                float(slo.get("tpot_s", 0.1))))
    return out


def day_table(runs: list[str | Path]) -> pd.DataFrame:
    """:func:`compare_table` of :data:`DAY`'s figures (:func:`day_figures`), every run's
    worst window over the first autoscaled run's window (the same windows for all)."""
    if len(runs) < 2:
        raise ScenarioError("compare --day: give at least two run folders")
    window = next((w for w in (read_run(r)[0].get("slo_window_s") for r in runs) if w), None)
    figures = [day_figures(r, window) for r in runs]
    # Disaggregated days: the replicas and GPU-hours of each pool after the totals.
    pools = list(dict.fromkeys(k.removeprefix("day_gpu_hours_pool_") for f in figures
                               for k in f if k.startswith("day_gpu_hours_pool_")))
    rows = DAY + [row for p in pools for row in (
        (f"day_replicas_mean_pool_{p}", f"replicas (time mean), pool {p}"),
        (f"day_gpu_hours_pool_{p}", f"GPU-hours paid, pool {p}"))]
    return _table(figures, _names(runs), rows)


def _shown(value) -> bool:
    """Whether a summary value is worth a row (NaN and absent ones are not)."""
    return value is not None and not (isinstance(value, float) and not np.isfinite(value))


def _names(runs: list[str | Path]) -> list[str]:
    names = [Path(r).name or str(r) for r in runs]
    if len(set(names)) < len(names):  # same folder names under different parents
        names = [str(r) for r in runs]
    return names


@plain_text
def compare_plot(runs: list[str | Path], path: Path) -> Path:
    """TTFT, TPOT and E2E CDFs of every run, overlaid (completed requests)."""
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    for name, run in zip(_names(runs), runs, strict=True):
        requests = read_run(run)[1]
        for ax, metric in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), strict=True):
            cdf(requests, metric, None, ax, label=name)
    legend_outside(axes[-1], 8)  # the same runs in every panel: one legend, outside
    fig.suptitle("latency CDFs of " + " vs ".join(_names(runs)))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def format_compare(table: pd.DataFrame) -> str:
    """The comparison as aligned text: label, each run's value, each difference in %."""
    runs = [c for c in table.columns if c not in ("metric", "label")
            and " - " not in c and "(%)" not in c]
    pct = [c for c in table.columns if c.endswith("(%)")]
    text = {r: [_fmt(v) if v is not None else "" for v in table[r]] for r in runs}
    width = max(max((len(t) for t in text[r]), default=0) for r in runs) + 2
    width = max(width, min(max(len(r) for r in runs), 28) + 2)
    label = max([len(x) for x in table["label"]] + [10]) + 2
    head = f"  {'':<{label}}" + "".join(f"{r[-width + 2:]:>{width}}" for r in runs) + "".join(
        f"{'run ' + str(i + 2) + ' Δ%':>11}" for i in range(len(pct)))
    lines = [head]
    for i in range(len(table)):
        cells = "".join(f"{text[r][i]:>{width}}" for r in runs)
        cells += "".join(f"{table[c].iloc[i]:>+10.1f}%" if pd.notna(table[c].iloc[i])
                         else f"{'':>11}" for c in pct)
        lines.append(f"  {table['label'].iloc[i]:<{label}}{cells}")
    return "\n".join(lines)
