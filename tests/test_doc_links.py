"""Every link and every repository path in README.md and docs/*.md leads somewhere.

Two kinds of reference are checked: markdown links to relative targets (``[text](file.md)``,
``[text](file.md#anchor)``, ``[text](#anchor)``), whose file must exist and whose anchor must
be a heading of that file (GitHub's slugs: lower case, punctuation dropped, spaces to
hyphens, ``-1``, ``-2`` for repeats); and paths the prose names in this repository
(``docs/...``, ``tests/...``, ``benchmarks/...``, ``workloads/...``, ...), which must exist, so
that moving a file cannot leave a page pointing at nothing. Paths inside another project
(``vllm/benchmarks/serve.py``) and in ``git show COMMIT:path`` (a file of an old commit) are
not this repository's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("docs", "tests", "benchmarks", "workloads", "simulator", "topologies", "notebooks",
       "traces")
#: A repository path in prose; the look-behind skips another project's (``vllm/docs/...``)
#: and a commit's (``8c4eae0:benchmarks/...``).
PATH = re.compile(r"(?<![\w./:-])(?:" + "|".join(TOP) + r")/[\w./+-]*\w")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """The anchors of every heading of ``doc`` (fenced code left out)."""
    seen: dict[str, int] = {}
    for line in re.sub(r"```.*?```", "", doc.read_text(), flags=re.S).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            seen[s] = seen.get(s, -1) + 1
            if seen[s]:
                seen[f"{s}-{seen[s]}"] = 0
    return set(seen)


def links(doc: Path) -> list[str]:
    """The relative targets of the markdown links of ``doc`` (outside fenced code)."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def test_slugs_follow_github():
    assert slug("Steady figures") == "steady-figures"
    assert slug("`run` and `plot`: what a run writes") == "run-and-plot-what-a-run-writes"
    assert slug("TP x PP (and DP)") == "tp-x-pp-and-dp"


def test_the_path_pattern_skips_other_projects_and_commits():
    text = "see vllm/benchmarks/serve.py, git show 8c4eae0:benchmarks/old.py and docs/x.md."
    assert PATH.findall(text) == ["docs/x.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_relative_link_resolves(doc):
    bad = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            bad.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            bad.append(f"{target}: no heading with that anchor")
    assert not bad, f"{doc.name}: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_repository_path_named_exists(doc):
    missing = sorted({p for p in PATH.findall(doc.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"
