"""README.md and docs/*.md are written for users: what, how, why, with numbers; not a log of
how the code got there.

Each pattern below is a habit of development notes that a user cannot act on: issue
numbers (``#28``, "the issue found"), dated reruns, the load of the machine a figure ran on,
"before / now" comparisons with an earlier version and golden files re-recorded "with this
change". A citation of another project's pull request (``PR #27614``), a date inside a link
(a blog post's) or inside inline code (what a command prints) is not history and is allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HISTORY = {
    "an issue number": r"(?<!PR )(?<![\w&/])#\d+\b",
    "an issue": r"\bissues?\b",
    "a development session": r"\b(?:earlier|previous|this|another) sessions?\b",
    "the machine's load": r"\bload average",
    "a dated rerun": r"\b20\d\d-[01]\d-[0-3]\d\b",
    "a before / after comparison": r"\bbefore / now\b|\(before:|\bbefore the [\w-]+ (?:fix|switch)"
                                   r"|\bwith this change\b|\ban earlier version\b"
                                   r"|\bthe old (?:function|code|planner|version)\b",
    "re-recorded outputs": r"\b(?:was|were) re-recorded\b",
}


def prose(text: str) -> str:
    """``text`` without what is not the page's own words: URLs and link targets, the text of
    links (citations), inline code (what a command prints). Fenced blocks stay: a
    transcript should not show the load of the machine it ran on either."""
    fenced = "\n".join(re.findall(r"```.*?```", text, re.S))
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", "", text)
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"https?://\S+", "", f"{text}\n{fenced}")


def findings(text: str) -> list[str]:
    out = []
    for what, pattern in HISTORY.items():
        for m in re.finditer(pattern, prose(text), re.I):
            out.append(f"{what}: {m.group(0)!r}")
    return out


def test_the_patterns_catch_history_and_allow_citations():
    assert findings("fixed in #28; the issue found it too slow")  # two findings
    assert len(findings("fixed in #28; the issue found it too slow")) == 2
    assert findings("measured 2026-12-01 on a shared machine, load average 4.0")
    assert findings("TTFT mean before / now | 41 / 42 ms")
    assert findings("(before: 63.5 / 216.3 / 861.0)")
    assert findings("a result from before the serial-term fix")
    assert findings("their golden files were re-recorded")
    assert not findings("is now enabled by default, PR #27614")
    assert not findings("([LMSYS blog, 2025-05-05](https://lmsys.org/blog/2025-05-05-x))")
    assert not findings("prints `fitted 2026-12-01 on 17789 rows`")
    assert not findings("every turn of a session reuses the answer; sessions.csv")
    assert findings("```text\nmachine: 2 CPUs, load average 4.0\n```")


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_docs_read_as_user_documentation(doc):
    found = findings(doc.read_text())
    assert not found, f"{doc.relative_to(ROOT)}: development history: {found}"


CODE = [p for d in ("simulator", "tests", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
#: An issue number in a comment, a docstring or a file name: ``issue 21``, ``(#16)``.
ISSUE_REF = re.compile(r"\bissues? #?\d+\b|(?<!PR )(?<![\w&/:'\"])#\d+\b")


def test_code_and_test_names_carry_no_issue_numbers():
    assert ISSUE_REF.search("costs 0.13 s (issue 21).") and ISSUE_REF.search("of #16, #18")
    assert not ISSUE_REF.search('color:#222; "#1f77b4"; vLLM PR #17885')
    found = [f"{p.relative_to(ROOT)}:{i}" for p in CODE if p.name != Path(__file__).name
             for i, line in enumerate(p.read_text().splitlines(), 1) if ISSUE_REF.search(line)]
    named = [p.name for p in CODE if re.search(r"\d\d+\.py$|issue", p.name)]
    assert not found and not named, (found[:10], named)
