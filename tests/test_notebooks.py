"""Every notebook in notebooks/ runs top to bottom and draws its figures (outputs are not
kept in git), and every panel reads: its axes are labelled, and no axis label, title or
legend entry is a raw column key (``ttft_p99_s`` where "TTFT p99 (s)" belongs). Importing the
plotting module leaves the caller's matplotlib backend alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


#: Run before a notebook's first cell: every figure is inspected when the inline backend
#: closes it after the cell that drew it.
WATCH = """
import re as _re
import matplotlib.pyplot as _pyplot
_label_problems = []
_close = _pyplot.close


def _raw_key(text):
    return bool(_re.fullmatch(r"[a-z0-9.]+(_[a-z0-9.]+)+", text.strip()))


def _inspect(fig):
    for ax in fig.axes:
        if not ax.get_visible() or not (ax.lines or ax.patches or ax.collections
                                        or ax.images):
            continue
        where = f"figure {fig.number}, panel {ax.get_title() or ax.get_ylabel()!r}"
        # a twin axis (twinx) shares its x label with the panel it sits on
        xlabel = ax.get_xlabel() or next((a.get_xlabel() for a in
                                          ax.get_shared_x_axes().get_siblings(ax)
                                          if a is not ax and a.get_xlabel()), "")
        for side, text in (("x", xlabel), ("y", ax.get_ylabel())):
            if not text.strip():
                _label_problems.append(f"{where}: no {side} label")
        legend = ax.get_legend()
        names = [t.get_text() for t in legend.get_texts()] if legend else []
        for text in (ax.get_xlabel(), ax.get_ylabel(), ax.get_title(), *names):
            if _raw_key(text):
                _label_problems.append(f"{where}: raw key {text!r}")


def _inspecting_close(fig=None):
    for n in _pyplot.get_fignums():
        _inspect(_pyplot.figure(n))
    return _close(fig)


_pyplot.close = _inspecting_close
"""
CHECK = "_pyplot.close('all')\nassert not _label_problems, _label_problems"


def test_the_label_check_finds_raw_keys_and_missing_labels():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(WATCH), *[
        nbformat.v4.new_code_cell(src) for src in (
            "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
            "ax.plot([0, 1], label='ttft_p99_s')\nax.legend()\nax.set_xlabel('rate')",
            "print(_label_problems)")]])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    printed = nb.cells[2].outputs[0]["text"]
    assert "no y label" in printed and "raw key 'ttft_p99_s'" in printed, printed


def _draws(source: str) -> bool:
    return "plt.subplots" in source or "plotting." in source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_draws_its_figures(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "notebooks are committed with outputs stripped"
    assert not any("matplotlib.use(" in c.source for c in nb.cells), \
        "a notebook must not force a backend: figures would not show"
    cells = nb.cells
    nb.cells = [nbformat.v4.new_code_cell(WATCH), *cells, nbformat.v4.new_code_cell(CHECK)]
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.cells = cells
    drawing = [c for c in nb.cells if c.cell_type == "code" and _draws(c.source)]
    assert drawing, "every notebook draws at least one figure"
    for cell in drawing:
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert images, f"no figure shown by the cell:\n{cell.source[:200]}"


def test_importing_plotting_keeps_the_callers_backend():
    code = ("import matplotlib; matplotlib.use('svg'); import simulator.plotting; "
            "import simulator.cli; print(matplotlib.get_backend())")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert out.strip() == "svg"
