"""The one exception users see: a scenario problem, named by file and key."""

from __future__ import annotations


class ScenarioError(ValueError):
    """One or more problems with a scenario, each naming the key and what is allowed.

    Parameters
    ----------
    problems : list of str
        Each ``"section.key: what is wrong (what is allowed)"``.
    source : str, optional
        The scenario file the problems come from, prefixed to every line.
    """

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        super().__init__(self.render())

    def with_source(self, source: str | None) -> ScenarioError:
        return type(self)(self.problems, source if self.source is None else self.source)

    def render(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        return "\n".join(prefix + p for p in self.problems)


class NoAnswer(ScenarioError):
    """A well-formed question without an answer: no layout fits, or nothing meets the
    SLOs (``plan`` and ``capacity`` exit 3, not 2), each problem naming the closest miss
    and what binds it."""
