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
* a plan table the doc shows after a ``plan`` transcript (``| rank | layout | ...``) must be
  the plan.csv that run wrote, to the same tolerance (its ``estimate`` and ``note`` cells
  word for word);
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

import pandas as pd
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


def _plan_table(text: str) -> list[dict[str, str]]:
    """The rows of the ``| rank | layout | ...`` table that follows a block (in ``text``, up
    to the next fenced block), as {header: cell}; empty when there is none."""
    end = text.find("```")
    lines = [ln for ln in (text[:end] if end >= 0 else text).splitlines()
             if ln.startswith("|")]
    if not lines or not lines[0].startswith("| rank | layout |"):
        return []
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, [c.strip() for c in ln.strip("|").split("|")], strict=True))
            for ln in lines[2:]]


#: Plan-table columns and the plan.csv column each quotes.
PLAN_COLUMNS = {"seqs": "max_num_seqs", "budget": "max_num_batched_tokens", "GPUs": "gpus",
                "TTFT p99 (s)": "ttft_slo_q_s", "TPOT p99 (s)": "tpot_slo_q_s",
                "tok/s per GPU": "throughput_tok_per_s_per_gpu",
                "goodput/GPU": "goodput_req_per_s_per_gpu", "SLO": "slo_met",
                "est. TTFT p99 (s)": "est_ttft_p99_s", "est. TPOT (s)": "est_tpot_s",
                "estimate": "est_slo", "requests": "requests_total", "note": "note"}


def plan_table_differences(rows: list[dict[str, str]], plan) -> list[tuple]:
    """(rank, column, quoted, plan.csv's value) for every cell of a doc's plan table that
    plan.csv does not reproduce. The estimated TPOT of a disaggregated row is the decode
    pool's p99 estimate, which plan.csv does not hold: it is not compared."""
    out = []
    for row in rows:
        r = plan[plan["rank"] == int(row["rank"])].iloc[0]
        for header, col in PLAN_COLUMNS.items():
            if header not in row or (header == "est. TPOT (s)"
                                     and row["layout"].startswith("prefill ")):
                continue
            quoted, value = row[header], r[col]
            if header == "SLO":
                same = (quoted == "met") == bool(value)
            elif header in ("estimate", "note"):
                same = quoted == (str(value) if value == value else "")  # NaN: empty
            elif quoted == "inf":
                same = value == float("inf")
            else:
                same = close(str(value), quoted.replace(",", ""))
            if not same:
                out.append((row["rank"], header, quoted, value))
    return out


def transcripts() -> list[tuple[str, str, int, list[str]]]:
    """(doc, command, expected exit status, quoted output lines) of every transcript."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
            block, before = m.group(1), len(out)
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
            if len(out) > before and (table := _plan_table(text[m.end():])):
                TABLES[doc.name, len(out) - 1] = table  # after the block's last transcript
    return out


#: (doc, index into TRANSCRIPTS) -> the plan table the doc shows after that transcript.
TABLES: dict[tuple[str, int], list[dict[str, str]]] = {}
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
    plan = pd.DataFrame([{"rank": 1, "gpus": 4, "ttft_slo_q_s": 0.7853, "slo_met": True,
                          "note": float("nan"), "est_ttft_p99_s": float("inf")}])
    row = {"rank": "1", "layout": "TP4 PP1 DP1", "GPUs": "4", "TTFT p99 (s)": "0.785",
           "SLO": "met", "note": "", "est. TTFT p99 (s)": "inf"}
    assert plan_table_differences([row], plan) == []
    assert plan_table_differences([{**row, "TTFT p99 (s)": "0.801", "SLO": "missed"}], plan) == [
        ("1", "TTFT p99 (s)", "0.801", 0.7853), ("1", "SLO", "missed", True)]


def test_the_docs_have_transcripts():
    assert len(TRANSCRIPTS) >= 15
    assert len(TABLES) >= 5  # planner.md's plan tables
    assert all(TRANSCRIPTS[i][1].startswith("python -m simulator plan ") for _, i in TABLES)
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
    table = TABLES.get((where, TRANSCRIPTS.index((where, command, status, quoted))))
    if table:  # the plan table the doc shows after it, from the plan.csv this run wrote
        folder = re.search(r"outputs in (\S+)/ \(plan.csv", proc.stdout).group(1)
        wrong = plan_table_differences(table, pd.read_csv(workspace / folder / "plan.csv"))
        assert not wrong, f"{where}: {command}\nplan table cells that do not reproduce: {wrong}"


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
