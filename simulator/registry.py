"""One registry per policy family: the names a scenario may give and what each stands for.

A family (routers, schedulers, engine profiles, CUDA-graph capture rules, benchmark clients,
autoscaling policies and forecasters) is declared here once, with the module that implements
it. That module fills it beside its implementations (``ROUTERS = registry.ROUTERS.add({...})``),
and the scenario schema names the family as the allowed values of its key
(``choices=registry.ROUTERS``), so a new router is one entry beside its class: validation,
did-you-mean hints and the error's list of allowed names follow.

The family is filled when its module is imported; asking a family for its names imports that
module first (:meth:`Family.names`), so validating a scenario never depends on what happened to
be imported before. The registry itself imports nothing of the package but the error type.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from simulator.errors import ScenarioError


class Family:
    """The registered names of one policy family, in registration order, and their
    implementations (a class, a factory or a table of values).

    Parameters
    ----------
    key : str
        The scenario key that names a member (``"router.policy"``): the error of an unknown
        name says it.
    home : str
        The module that registers the members (imported on first use).
    """

    def __init__(self, key: str, home: str) -> None:
        self.key, self.home = key, home
        self._members: dict[str, Any] = {}

    def add(self, members: Mapping[str, Any]) -> Family:
        """Register ``members`` (name -> implementation); a name registered twice is a
        programming error. Returns the family, so the implementing module may keep it under
        its own name."""
        for name, impl in members.items():
            if name in self._members:
                raise ValueError(f"{self.key}: {name!r} is registered twice")
            self._members[name] = impl
        return self

    def remove(self, name: str) -> None:
        """Unregister ``name`` (a test's or a notebook's own member)."""
        del self._members[name]

    def _load(self) -> dict[str, Any]:
        if not self._members:
            importlib.import_module(self.home)
        return self._members

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._load())

    def get(self, name: str) -> Any:
        """The implementation of ``name``; an unknown name is a one-line error that lists
        the registered ones."""
        members = self._load()
        if name not in members:
            raise ScenarioError(f"{self.key}: unknown {name!r} (allowed: "
                                f"{', '.join(members)})")
        return members[name]

    def __getitem__(self, name: str) -> Any:
        return self._load()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._load()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._load())

    def items(self):
        return self._load().items()

    def values(self):
        return self._load().values()

    def __repr__(self) -> str:
        return f"Family({self.key!r}: {', '.join(self._members) or 'not loaded'})"


ROUTERS = Family("router.policy", "simulator.cluster.router")
SCHEDULERS = Family("engine.scheduler", "simulator.engine.schedulers")
PROFILES = Family("engine.profile", "simulator.io.profiles")
CAPTURE_RULES = Family("engine.cuda_graphs", "simulator.io.profiles")
CLIENTS = Family("workload.client", "simulator.workload.clients")
AUTOSCALE_POLICIES = Family("autoscale.policy", "simulator.cluster.autoscale")
FORECASTERS = Family("autoscale.forecaster", "simulator.cluster.autoscale")
