"""Labels of the planner's Pareto plot: close points get labels whose boxes do not
intersect (as "k3 pick" and "k5" of the 70B EAGLE plan would)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from simulator.planner.plots import LABEL_OFFSETS, LEADER_PT, label_points, pareto_plot  # noqa: E402


def _boxes(annotations):
    return [a.get_window_extent(a.figure.canvas.get_renderer()) for a in annotations]


def test_labels_of_close_points_do_not_intersect():
    # The EAGLE plot's two speculative points, 5.5 tok/s apart on a 25-90 axis: the first
    # label, right of its point, reaches past the second point, so the same offset for
    # both overlaps (checked first, so the test can fail).
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs, ys = [28.0, 62.5, 68.0, 88.0], [233.0, 257.0, 258.0, 65.0]
    ax.scatter(xs, ys)
    texts = ["2/1/1", "2/1/1 k3 pick", "2/1/1 k5", "8/1/1 rule"]
    naive = [ax.annotate(t, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
             for x, y, t in zip(xs, ys, texts, strict=True)]
    fig.canvas.draw()
    assert _boxes(naive)[1].overlaps(_boxes(naive)[2])
    for a in naive:
        a.remove()
    placed = label_points(ax, list(zip(xs, ys, texts, strict=True)))
    fig.canvas.draw()
    boxes = _boxes(placed)
    assert [a.get_text() for a in placed] == texts
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (texts[i], texts[j])
    # Each label stays beside its own point: its nearest corner within 40 points of it.
    for a, b in zip(placed, boxes, strict=True):
        px, py = ax.transData.transform(a.xy)
        near = min(abs(px - b.x0), abs(px - b.x1)), min(abs(py - b.y0), abs(py - b.y1))
        assert max(near) <= 40 * fig.dpi / 72
    plt.close(fig)


def test_labels_avoid_other_points_and_the_legend(tmp_path):
    # A point right of another at label height: the first label goes elsewhere, off the
    # second marker; the legend stays where it was drawn and no label covers it.
    fig, ax = plt.subplots(figsize=(6, 4))
    xs, ys = [10.0, 10.6, 20.0], [5.0, 5.05, 1.0]
    ax.scatter(xs, ys, label="points")
    ax.legend(loc="upper right")
    placed = label_points(ax, [(10.0, 5.0, "a long label here"), (20.0, 1.0, "b")])
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    other = ax.transData.transform((10.6, 5.05))
    box = placed[0].get_window_extent(r)
    assert not box.contains(*other)
    legend = ax.get_legend().get_window_extent(r)
    assert not any(a.get_window_extent(r).overlaps(legend) for a in placed)
    plt.close(fig)


def test_a_crowd_of_points_gets_labels_in_turn_and_leader_lines_when_far():
    # Seven points a pixel or two apart: each label takes the next free offset in
    # LABEL_OFFSETS' order; the seventh lands 19 points below its point and gets a line.
    fig, ax = plt.subplots(figsize=(6, 4))
    ys = [5.0, 5.02, 4.98, 5.04, 4.96, 5.06, 4.94]
    ax.scatter([0.0, 20.0, *[10.0] * len(ys)], [0.0, 10.0, *ys])
    placed = label_points(ax, [(10.0, y, f"label {i}") for i, y in enumerate(ys)])
    assert [tuple(a.xyann) for a in placed] == LABEL_OFFSETS[:len(ys)]
    assert [a.arrow_patch is not None for a in placed] == [
        abs(dy) > LEADER_PT for _, dy in LABEL_OFFSETS[:len(ys)]] == [False] * 6 + [True]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    text = [Text.get_window_extent(a, r) for a in placed]  # the text, without its line
    assert not any(text[i].overlaps(text[j]) for i in range(len(ys))
                   for j in range(i + 1, len(ys)))
    plt.close(fig)


def test_a_point_without_a_value_keeps_its_label_and_the_others_place_theirs():
    fig, ax = plt.subplots()
    ax.scatter([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    placed = label_points(ax, [(1.0, float("nan"), "none"), (2.0, 2.0, "two")])
    assert [a.get_text() for a in placed] == ["none", "two"]
    assert tuple(placed[1].xyann) == (4, 3)  # nothing in its way: the first offset
    fig.canvas.draw()  # the label of a point off the scales draws nothing, breaks nothing
    plt.close(fig)


def test_pareto_plot_writes_the_figure(tmp_path):
    t = pd.DataFrame({"tp": [2, 2, 8], "pp": [1, 1, 1], "dp": [1, 1, 1],
                      "spec_k": [3, 5, 0], "rank": [1, 2, 3], "slo_met": [True, True, True],
                      "note": ["", "", "rule of thumb"], "kind": ["colocated"] * 3,
                      "tok_per_s_per_user": [62.5, 68.0, 88.0],
                      "throughput_tok_per_s_per_gpu": [257.0, 258.0, 65.0],
                      "gpu_hour_usd": [2.5, 2.5, 2.5]})
    path = pareto_plot(t, tmp_path / "p.png", "t")
    assert path.stat().st_size > 10_000


def test_front_goes_through_meeting_points_only(tmp_path, monkeypatch):
    """A point that misses the SLOs but beats every other on both axes is drawn, hollow,
    and the front is drawn through the meeting points alone."""
    import simulator.planner.plots as plots

    t = pd.DataFrame({"tok_per_s_per_user": [10.0, 20.0, 30.0],
                      "throughput_tok_per_s_per_gpu": [300.0, 200.0, 900.0],
                      "slo_met": [True, True, False], "tp": [1, 2, 4], "pp": [1, 1, 1],
                      "dp": [1, 1, 1], "rank": [1, 2, 3], "note": ["", "", ""],
                      "kind": ["colocated"] * 3, "spec_k": [0, 0, 0]})
    drawn = []
    real = plots.pareto_front

    def spy(x, y):
        drawn.append((list(x), list(y)))
        return real(x, y)

    monkeypatch.setattr(plots, "pareto_front", spy)
    plots.pareto_plot(t, tmp_path / "p.png", "t")
    # the missing point (30, 900) would dominate both: the front is computed without it
    assert drawn == [([10.0, 20.0], [300.0, 200.0])]
