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
run, and their quoted figures compared, by tests/test_doc_transcripts.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

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
