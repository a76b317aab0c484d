"""Figures of the planner: the Pareto plot of a plan and the latency-vs-rate curve of a
capacity search. matplotlib is imported inside the drawing functions (it costs ~2 s of
start-up that ``plan`` and ``capacity`` without figures should not pay).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulator.planner.space import cross_kind, speculating


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of the points no other point beats on both axes (both maximized).

    A point is dominated when some other point has ``x' >= x`` and ``y' >= y`` with one
    of them strictly greater. NaN points are never on the front.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    front = np.zeros(len(x), dtype=bool)
    for i in np.flatnonzero(ok):
        ge = ok & (x >= x[i]) & (y >= y[i])
        gt = (x > x[i]) | (y > y[i])
        front[i] = not np.any(ge & gt)
    return front


#: Where a point's label goes, tried in turn (offset from the point in typographic points;
#: a negative x offset right-aligns the label): right and above first, then right below,
#: left, and further out above and below.
LABEL_OFFSETS = [(dx, dy) for dy in (3, -10, 12, -19, 21, -28, 30, -37)
                 for dx in (4, -4)]
#: Width of a scatter marker in points (matplotlib's default: ``s = 36``, 6 points wide).
MARKER_PT = 6.0
#: A label placed further than this above or below its point (points) gets a leader line.
LEADER_PT = 12


def _overlap(a, b) -> float:
    """Area (pixels^2) that boxes ``a`` and ``b`` (x0, y0, x1, y1) share."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return max(w, 0.0) * max(h, 0.0)


def label_points(ax, labels: list[tuple[float, float, str]], fontsize: float = 7) -> list:
    """Annotate ``(x, y, text)`` points of ``ax`` so that no two labels overlap where room
    allows.

    Each label, in order, takes the first offset of :data:`LABEL_OFFSETS` whose box
    (its window extent) overlaps none of the labels already placed, the markers of the
    axes' scatter points other than its own, the legend, nor leaves the axes; when every
    offset collides it takes the one with the least overlap; a label that lands more than
    :data:`LEADER_PT` above or below its point gets a thin line to it. The figure is drawn first, so
    that the axes limits and the legend's place are final; the legend is then pinned where
    it was drawn (``loc="best"`` would otherwise move it around the labels on the next
    draw). Sizes are in display pixels, so a later ``savefig`` at another dpi scales
    everything alike and keeps them apart.

    Returns
    -------
    list of matplotlib.text.Annotation
        One per label, in order.
    """
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer).extents
    taken = []
    legend = ax.get_legend()
    if legend is not None:
        box = legend.get_window_extent(renderer)
        legend.set_loc(tuple(ax.transAxes.inverted().transform((box.x0, box.y0))))
        taken.append(box.extents)
    r = MARKER_PT / 2 * fig.dpi / 72.0  # a scatter marker's half width, pixels
    centres = [xy for c in ax.collections if len(c.get_offsets())
               for xy in c.get_offset_transform().transform(c.get_offsets())]
    out = []
    for xi, yi, text in labels:
        own = ax.transData.transform((xi, yi))
        obstacles = taken + [(u - r, v - r, u + r, v + r) for u, v in centres
                             if not np.allclose((u, v), own)]
        best, best_cost = None, np.inf
        for dx, dy in LABEL_OFFSETS:
            a = ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(dx, dy),
                            ha="left" if dx > 0 else "right", fontsize=fontsize)
            box = a.get_window_extent(renderer).extents
            cost = (sum(_overlap(box, o) for o in obstacles)
                    + (box[2] - box[0]) * (box[3] - box[1]) - _overlap(box, frame))
            cost = cost if np.isfinite(cost) else np.inf  # a point off the scales (NaN)
            if best is None or cost < best_cost:
                if best is not None:
                    best.remove()
                best, best_cost = a, cost
            else:
                a.remove()
            if cost == 0:
                break
        taken.append(best.get_window_extent(renderer).extents)
        if abs(best.xyann[1]) > LEADER_PT:  # far from its point: a thin line leads to it
            dx, dy = best.xyann
            best.remove()
            best = ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(dx, dy),
                               ha="left" if dx > 0 else "right", fontsize=fontsize,
                               arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5,
                                           "shrinkA": 0, "shrinkB": MARKER_PT / 2})
        out.append(best)
    return out


def pareto_plot(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Throughput per GPU, per dollar when the rows carry ``gpu_hour_usd`` and per joule
    when they carry ``tokens_per_joule``, against tokens/s per user (1 / TPOT p50) of the
    simulated candidates; the Pareto front joined through the points that meet the SLOs
    only (a point that misses is no option, whatever it scores), SLO misses hollow, the
    pick and the rule of thumb labelled. Writes a PNG to ``path``."""
    import matplotlib  # noqa: PLC0415 - on use (start-up cost)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ok = table[table["tok_per_s_per_user"].notna()]  # runs that failed have no speed
    x = ok["tok_per_s_per_user"].to_numpy(dtype=float)
    per_gpu = ok["throughput_tok_per_s_per_gpu"].to_numpy(dtype=float)
    panels = [(per_gpu, "throughput per GPU (output tok/s)")]
    if "gpu_hour_usd" in ok and ok["gpu_hour_usd"].notna().all() and len(ok):
        usd = per_gpu * 3600.0 / ok["gpu_hour_usd"].to_numpy(dtype=float)
        panels.append((usd, "output tokens per dollar"))
    if "tokens_per_joule" in ok and ok["tokens_per_joule"].notna().any():
        panels.append((ok["tokens_per_joule"].to_numpy(dtype=float),
                       "output tokens per joule"))
    met = ok["slo_met"].to_numpy(dtype=bool)
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    ax_labels = []
    for ax, (y, ylabel) in zip(axes[0], panels, strict=True):
        front = np.zeros(len(x), dtype=bool)
        front[met] = pareto_front(x[met], y[met])  # the options only: points that meet
        ax.scatter(x[met], y[met], color="tab:blue", label="meets the SLOs", zorder=3)
        ax.scatter(x[~met], y[~met], facecolors="none", edgecolors="tab:red",
                   label="misses an SLO", zorder=3)
        order = np.argsort(x[front])
        ax.plot(x[front][order], y[front][order], color="tab:blue", alpha=0.5,
                linestyle="--", label="Pareto front")
        drawn: set[str] = set()
        labels = []
        for (_, r), xi, yi in zip(ok.iterrows(), x, y, strict=True):
            text = f"{int(r['tp'])}/{int(r['pp'])}/{int(r['dp'])}"
            if r.get("kind") == "disaggregated":  # prefill pool + decode pool
                text = (f"P{int(r['prefill_tp'])}/{int(r['prefill_pp'])}/"
                        f"{int(r['prefill_dp'])}+D{text}")
            if speculating(r):
                text += f" k{int(r['spec_k'])}"
            if isinstance(r.get("node"), str):  # a cross-kind pair: prefill kind>decode kind
                dec = cross_kind(r)
                text = f"{r['node']}{'>' + dec if dec else ''} {text}"
            if r["rank"] == 1 and r["slo_met"]:
                text += " pick"
            if "rule of thumb" in str(r["note"]):
                text += " rule"
            if text in drawn:  # engine-limit variants of a layout: one label
                continue
            drawn.add(text)
            labels.append((xi, yi, text))
        ax.set_xlabel("tokens/s per user (1 / TPOT p50); labels: TP/PP/DP "
                      "(P.../D...: prefill/decode pools, k: drafts)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax_labels.append((ax, labels))
    fig.suptitle(title or "plan: TP/PP/DP of the simulated candidates", fontsize=10)
    fig.tight_layout()
    for ax, labels in ax_labels:  # placed once the axes have their final size
        label_points(ax, labels)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def capacity_plot(curve: pd.DataFrame, path: str | Path, rate_per_s: float,
                  ttft_slo_s: float, tpot_slo_s: float, quantile: float,
                  title: str = "") -> Path:
    """TTFT and TPOT at the SLO quantile against the offered rate, with the SLO targets
    and the capacity found. Writes a PNG to ``path``."""
    import matplotlib  # noqa: PLC0415 - on use (start-up cost)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    c = curve.sort_values("rate_per_s")
    p = f"p{quantile * 100:g}"
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, col, slo, name in ((axes[0], "ttft_slo_q_s", ttft_slo_s, "TTFT"),
                               (axes[1], "tpot_slo_q_s", tpot_slo_s, "TPOT")):
        y = c[col].to_numpy(dtype=float)
        y = np.where(np.isfinite(y), y, np.nan)
        met = c["met"].to_numpy(dtype=bool)
        ax.plot(c["rate_per_s"], y, color="grey", linewidth=1)
        ax.scatter(c["rate_per_s"][met], y[met], color="tab:blue", label="sustained", zorder=3)
        ax.scatter(c["rate_per_s"][~met], y[~met], facecolors="none", edgecolors="tab:red",
                   label="not sustained", zorder=3)
        ax.axhline(slo, color="black", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
        ax.axvline(rate_per_s, color="tab:green", linewidth=1,
                   label=f"capacity {rate_per_s:.3g} req/s")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(f"{name} {p} (s)")
        if np.nanmax(y) / max(np.nanmin(y), 1e-9) > 50:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "capacity search")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
