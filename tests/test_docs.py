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

Transcripts (``$ python -m simulator ...`` lines in any block, followed by what the command
printed) run too, after the ```bash commands, and must exit with the status their comment
states (``# exit 2``; else 0). ``plan`` and ``capacity`` transcripts take seconds to a minute
each at their documented size; the default run gives them ``--requests 60 --top 2
--no-plot`` (the last flag wins), which exercises the same command line, and the slow
marker runs them as written.
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
#: Appended to a plan / capacity transcript in the default run (see the module docstring).
SMALLER = {"plan": ["--requests", "60", "--top", "2", "--no-plot"],
           "capacity": ["--requests", "60", "--no-plot"]}


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


def transcripts() -> list[tuple[str, str, int]]:
    """(where, command, expected exit status) for every ``$ python -m simulator`` line of
    every fenced block (its continuation lines joined)."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), re.S):
            for m in re.finditer(r"^\$ (python -m simulator (?:[^\n]*\\\n)*[^\n]*)", block,
                                 re.M):
                line = m.group(1).replace("\\\n", " ")
                command, _, comment = line.partition("#")
                status = re.search(r"exit (\d+)", comment)
                out.append((doc.name, re.sub(r"\s+", " ", command).strip(),
                            int(status.group(1)) if status else 0))
    return out


COMMANDS = commands()
TRANSCRIPTS = transcripts()


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
    assert len(TRANSCRIPTS) >= 13
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


def _transcript(workspace: Path, where: str, command: str, status: int, smaller: bool):
    extra = SMALLER.get(command.split()[3], []) if smaller else []
    proc = _run(workspace, command, extra)
    assert proc.returncode == status, (f"{where}: {command}\n{proc.stdout[-2000:]}"
                                       f"{proc.stderr[-2000:]}")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("where, command, status", TRANSCRIPTS,
                         ids=[f"{w}:{c[:60]}" for w, c, _ in TRANSCRIPTS])
def test_documented_transcript_runs(workspace, where, command, status):
    _transcript(workspace, where, command, status, smaller=True)


@pytest.mark.slow
@pytest.mark.parametrize("where, command, status", TRANSCRIPTS,
                         ids=[f"{w}:{c[:60]}" for w, c, _ in TRANSCRIPTS])
def test_documented_transcript_runs_at_its_size(workspace, where, command, status):
    _transcript(workspace, where, command, status, smaller=False)
