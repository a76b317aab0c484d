"""Every notebook in notebooks/ runs top to bottom and draws its figures (outputs are not
kept in git); importing the plotting module leaves the caller's matplotlib backend alone."""

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


def _draws(source: str) -> bool:
    return "plt.subplots" in source or "plotting." in source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_draws_its_figures(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "notebooks are committed with outputs stripped"
    assert not any("matplotlib.use(" in c.source for c in nb.cells), \
        "a notebook must not force a backend: figures would not show"
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
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
