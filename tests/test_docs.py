"""Every shell command in README.md and docs/*.md runs as written.

The ```bash blocks are read in order (README.md, then docs/ by name) and run one after the
other in one scratch folder that mirrors the repository (so that ``workloads/...`` and
``runs/...`` resolve as they do for a user in this folder, and a command may use what an
earlier one wrote, as the README's ``plot runs/llama70b-2xdgx`` uses its ``run``). Each must
exit 0 without a traceback. Setup commands are the one exception: creating a virtual
environment and ``pip install`` need the network and ``pytest`` is this suite; they are
checked to exist, not run (the rest of such a line, after ``&&``, runs, with
``.venv/bin/python`` read as this interpreter). Synopses with placeholders go in ```text
blocks, so they are not commands.

Transcripts (``$ python -m simulator ...`` lines followed by what the command printed) are
run, and their quoted figures compared, by tests/test_doc_transcripts.py. A table a page
builds from the files a command here writes is checked after the command has run (reading
those files; figures to half a unit of their last digit plus 0.5%).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETUP = ("python -m pip install", "python -m pytest", "python3 -m venv",
         ".venv/bin/python -m pip install", ".venv/bin/python -m pytest")



def commands() -> list[tuple[str, str]]:
    """(where, command) for every command line of every ```bash block, in order."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", doc.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                parts = [p.strip() for p in line.split("#")[0].split("&&")]
                for part in parts:
                    part = part.removeprefix(".venv/bin/")
                    if part and not part.startswith(SETUP) and not part.startswith(
                            ".venv/bin/"):
                        out.append((doc.name, re.sub(r"\s+", " ", part)))
    return out


COMMANDS = commands()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder that looks like the repository (its entries linked), without runs/."""
    ws = tmp_path_factory.mktemp("docs")
    for entry in ROOT.iterdir():
        if entry.name not in ("runs", "results.csv") and not entry.name.startswith("."):
            (ws / entry.name).symlink_to(entry)
    return ws


def test_the_docs_have_commands_and_setup_lines_are_real():
    assert len(COMMANDS) >= 15
    readme = (ROOT / "README.md").read_text()
    assert ("python3 -m venv .venv && .venv/bin/python -m pip install -e . && "
            ".venv/bin/python -m simulator run") in readme
    assert all("SCENARIO" not in c for _, c in COMMANDS), "a synopsis belongs in ```text"


def _run(workspace: Path, command: str, extra: list[str] | None = None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    assert command.startswith("python "), command
    argv = [sys.executable, *shlex.split(command)[1:], *(extra or [])]  # this interpreter
    return subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_documented_command_runs_as_written(workspace, where, command):
    proc = _run(workspace, command)
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr
    assert "failed x" not in proc.stdout, proc.stdout  # a sweep whose points all work


def _close(value: float, quoted: str) -> bool:
    """``value`` agrees with a figure quoted to its last digit: half a unit of that digit
    plus 0.5% (the runs are deterministic; the slack absorbs platform differences)."""
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(value - float(quoted)) <= 10 ** -digits / 2 + 0.005 * abs(float(quoted))


def test_prefix_caching_router_table_reproduces(workspace):
    """docs/prefix-caching.md's table of hit rate (TTFT mean / p99) per router and cache,
    read from the CSV of the sweep the page runs (written by the command test above, or run
    here when this test runs alone)."""
    csv = workspace / "runs" / "mooncake-grid.csv"
    if not csv.exists():
        command = next(c for w, c in COMMANDS if w == "prefix-caching.md" and "sweep" in c)
        assert _run(workspace, command).returncode == 0
    runs = pd.read_csv(csv)
    text = (ROOT / "docs" / "prefix-caching.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if re.match(r"\| (round_robin|least_outstanding|prefix_aware|kv_aware|"
                        r"session_affinity)[ |]", line)]
    assert len(rows) == 5
    cells = {(True, 0.0): 1, (True, 256.0): 2, (False, 0.0): 4}  # the column per setting
    for row in rows:
        policy = row[0].split()[0]
        for (caching, host), col in cells.items():
            hit, mean, p99 = re.fullmatch(r"([\d.]+)% \(([\d.]+) / ([\d.]+)\)",
                                          row[col]).groups()
            r = runs[(runs["router.policy"] == policy) & (runs["engine.prefix_caching"] == caching)
                     & (runs["engine.kv_offload_gib"] == host)].iloc[0]
            assert _close(100 * r["prefix_hit_rate"], hit), (policy, col, r["prefix_hit_rate"])
            assert _close(r["ttft_mean_s"], mean), (policy, col, r["ttft_mean_s"])
            assert _close(r["ttft_p99_s"], p99), (policy, col, r["ttft_p99_s"])
