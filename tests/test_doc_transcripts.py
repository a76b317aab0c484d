"""Every ``$ python -m simulator ...`` transcript in README.md and docs/*.md prints what the
doc shows.

A transcript is a ``$ python -m simulator`` line in a fenced block (its ``\\`` continuation
lines joined), followed by the output the doc quotes, up to the next ``$`` line or the end of
the block. The command runs as written, in a scratch folder that mirrors the repository (so
its outputs land there, not in ``runs/`` of the checkout), and must exit with the status its
comment states (``# exit 3``; else 0). Its output (stdout, then stderr) must then hold every
quoted line, in the doc's order:

* a quoted line is an excerpt: its words, in order and adjacent, are words of the output (the
  doc may wrap a long line anywhere; it may leave out whole lines);
* ``...`` stands for words left out (a line that is only ``...`` is skipped);
* every number agrees with the printed one within half a unit of its last quoted digit plus
  0.5% of its value (the runs are deterministic; the slack absorbs floating-point differences
  between platforms, not modelling changes);
* wall-clock times (``in 4.6 s`` on the ``searched`` and ``probes`` lines, and the ``# 7 s``
  comments on the command lines) are not figures of the model and are not compared.

Commands that take over ~20 s on one core are marked slow (run with ``-m slow``); for each, a
fast variant on fewer GPUs with fewer requests (a few seconds) checks that the same kinds of
line come out (the labels of the quoted lines), which covers the same code paths: the
heterogeneous, disaggregated, per-dollar search and its printout.
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
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
#: Transcripts slower than ~20 s on one core: (doc, start of the command) -> the fast
#: variant's extra arguments (the last flag wins).
SLOW = {("planner.md", "python -m simulator plan workloads/plan-70b-hetero.toml"):
        ["--gpus", "12", "--requests", "100", "--top", "1"],
        ("planner.md", "python -m simulator plan workloads/disagg-splitwise-h100-a100.toml"):
        ["--gpus", "8", "--requests", "60", "--top", "1"]}


def transcripts() -> list[tuple[str, str, int, list[str]]]:
    """(doc, command, expected exit status, quoted output lines) of every transcript."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), re.S):
            parts = re.split(r"^\$ ", block, flags=re.M)
            for part in parts[1:]:
                if not part.startswith("python -m simulator "):
                    continue
                lines = part.splitlines()
                command = lines.pop(0)
                while command.endswith("\\"):
                    command = command[:-1] + " " + lines.pop(0)
                command, _, comment = command.partition("#")
                status = re.search(r"exit (\d+)", comment)
                out.append((doc.name, re.sub(r"\s+", " ", command).strip(),
                            int(status.group(1)) if status else 0,
                            [ln for ln in lines if ln.strip() and ln.strip() != "..."]))
    return out


TRANSCRIPTS = transcripts()


def _parts(word: str) -> list[str | float]:
    """A word split into text and numbers: ``x2.23`` -> ['x', 2.23, '']."""
    out: list[str | float] = []
    pos = 0
    for m in NUMBER.finditer(word):
        out += [word[pos:m.start()], m.group()]
        pos = m.end()
    return [*out, word[pos:]]


def close(printed: str, quoted: str) -> bool:
    """A printed number agrees with the quoted one (see the module docstring)."""
    value, figure = float(printed.replace(",", "")), float(quoted.replace(",", ""))
    mantissa = quoted.split("e")[0]
    digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
    unit = 10 ** (-digits + (int(quoted.split("e")[1]) if "e" in quoted else 0))
    return abs(value - figure) <= unit / 2 + 0.005 * abs(figure)


def same_word(printed: str, quoted: str) -> bool:
    """Two words agree: the same text around numbers that agree."""
    a, b = _parts(printed), _parts(quoted)
    if len(a) != len(b):
        return False
    return all((x == y) if i % 2 == 0 else close(x, y)
               for i, (x, y) in enumerate(zip(a, b, strict=True)))


def _timings(words: list[str]) -> list[str]:
    """The words with wall-clock times (``in 4.6 s`` after ``searched`` / ``probes``) made
    wildcards."""
    out = list(words)
    for i in range(1, len(out) - 1):
        if out[i - 1] == "in" and out[i + 1] in ("s", "s)") and NUMBER.fullmatch(out[i]):
            out[i] = "..."
    return out


def _match_at(words: list[str], at: int, quoted: list[str]) -> int | None:
    """The end of a match of ``quoted`` starting at ``words[at]`` (``...`` matching any run of
    words), or None."""
    if not quoted:
        return at
    if quoted[0] == "...":
        for j in range(at, len(words) + 1):
            end = _match_at(words, j, quoted[1:])
            if end is not None:
                return end
        return None
    if at < len(words) and same_word(words[at], quoted[0]):
        return _match_at(words, at + 1, quoted[1:])
    return None


def missing(output: str, quoted: list[str]) -> list[str]:
    """The quoted lines that the output does not hold, in order (empty when all agree)."""
    words = _timings(output.split())
    at, out = 0, []
    for line in quoted:
        q = _timings(line.split())
        found = next((end for start in range(at, len(words))
                      if (end := _match_at(words, start, q)) is not None), None)
        if found is None:
            out.append(line.strip())
        else:
            at = found
    return out


def test_the_comparison_reads_numbers_and_excerpts():
    out = ("plan x: on 8 GPUs\n  recommend  TP4 PP1 DP1 on 4 GPUs: TTFT p99 0.785 s of 2 s\n"
           "  searched   192 candidates in 2.2 s\n  rank 1.447e+04 1,105 x2.23\n")
    assert missing(out, ["  recommend  TP4 PP1 DP1 on 4 GPUs: TTFT p99 0.786 s", "of 2 s"]) == []
    assert missing(out, ["  searched   192 candidates in 9.9 s"]) == []  # a wall-clock time
    assert missing(out, ["rank 1.45e+04 1,104 x2.23"]) == []
    assert missing(out, ["recommend ... 0.785 s"]) == []
    assert missing(out, ["TTFT p99 0.80 s"]) == ["TTFT p99 0.80 s"]  # off by more than 0.5%
    assert missing(out, ["TP8 PP1 DP1"]) == ["TP8 PP1 DP1"]
    assert missing(out, ["searched 192", "recommend"]) == ["recommend"]  # out of order
    assert missing(out, ["rank 1.46e+04"]) == ["rank 1.46e+04"]


def test_the_docs_have_transcripts():
    assert len(TRANSCRIPTS) >= 15
    assert all(quoted for *_, quoted in TRANSCRIPTS), "a transcript quotes its output"
    for doc, start in SLOW:  # each slow entry names one transcript
        assert sum(d == doc and c.startswith(start) for d, c, *_ in TRANSCRIPTS) == 1, start


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder that looks like the repository (its entries linked), without runs/."""
    ws = tmp_path_factory.mktemp("transcripts")
    for entry in ROOT.iterdir():
        if entry.name not in ("runs", "results.csv") and not entry.name.startswith("."):
            (ws / entry.name).symlink_to(entry)
    return ws


def _run(workspace: Path, command: str, extra: list[str] | None = None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    argv = [sys.executable, *shlex.split(command)[1:], *(extra or [])]  # this interpreter
    return subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=600)


def _slow(where: str, command: str) -> list[str] | None:
    return next((extra for (doc, start), extra in SLOW.items()
                 if doc == where and command.startswith(start)), None)


def _check(workspace: Path, where: str, command: str, status: int, quoted: list[str]):
    proc = _run(workspace, command)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == status, (f"{where}: {command}\n{proc.stdout[-2000:]}"
                                       f"{proc.stderr[-2000:]}")
    lost = missing(proc.stdout + "\n" + proc.stderr, quoted)
    assert not lost, (f"{where}: {command}\nthese quoted lines do not reproduce:\n"
                      + "\n".join(lost) + f"\n--- the output:\n{proc.stdout}{proc.stderr}")


FAST = [t for t in TRANSCRIPTS if _slow(t[0], t[1]) is None]
SLOWS = [t for t in TRANSCRIPTS if _slow(t[0], t[1]) is not None]


@pytest.mark.parametrize("where, command, status, quoted", FAST,
                         ids=[f"{w}:{c[20:80]}" for w, c, *_ in FAST])
def test_transcript_reproduces(workspace, where, command, status, quoted):
    _check(workspace, where, command, status, quoted)


@pytest.mark.slow
@pytest.mark.parametrize("where, command, status, quoted", SLOWS,
                         ids=[f"{w}:{c[20:80]}" for w, c, *_ in SLOWS])
def test_slow_transcript_reproduces(workspace, where, command, status, quoted):
    _check(workspace, where, command, status, quoted)


@pytest.mark.parametrize("where, command, status, quoted", SLOWS,
                         ids=[f"{w}:{c[20:80]}" for w, c, *_ in SLOWS])
def test_slow_transcript_prints_the_same_lines_when_smaller(workspace, where, command, status,
                                                            quoted):
    """The fast variant of a slow transcript: with fewer requests, the command prints a line
    for every label the doc quotes (``workload``, ``searched``, ``recommend``, ...)."""
    proc = _run(workspace, command, _slow(where, command))
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
    labels = {ln.split(maxsplit=1)[0] for ln in quoted if not ln.startswith("      ")}
    printed = {ln.split(maxsplit=1)[0] for ln in proc.stdout.splitlines() if ln.strip()}
    assert labels - {"rank", *map(str, range(1, 11))} <= printed, labels - printed
