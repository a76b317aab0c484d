"""Dotted scenario keys: ``--set key=value``, ``--unset key`` and sweep grids speak the same
paths, ``pools.<pool name>.<key>`` included (the ``[[pools]]`` entry of that name).

A path names a key of the scenario's TOML: ``seed``, ``parallel.tp``,
``workload.prompt_tokens.mean``, ``pools.decode.engine.max_num_seqs``. Setting a key creates
the tables on its way; unsetting one removes it, so that the section's default (or nothing,
for an optional key such as ``workload.rate_per_s``) applies.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from simulator import files
from simulator.errors import ScenarioError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _excerpt(value: Any, limit: int = 40) -> str:
    return files.excerpt(value, limit)


def split_key(key: str, flag: str) -> list[str]:
    """The names of a dotted key path; ``flag`` names the option in the error."""
    parts = key.strip().split(".")
    if not all(p.strip() for p in parts):
        raise ScenarioError(f"{flag} {_excerpt(key)}: expected a key path of non-empty names "
                            f"separated by '.' (e.g. parallel.tp)")
    return [p.strip() for p in parts]


def parse_set(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (path, value); the value is read as TOML, a bare word as a
    string (``--set model.name=llama-2-7b``)."""
    key, eq, raw = text.partition("=")
    if not eq or not all(part.strip() for part in key.split(".")):
        raise ScenarioError(f"--set {_excerpt(text)}: expected section.key=value (a key "
                            f"path of non-empty names before the '=')")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:
        raise ScenarioError(f"--set {key.strip()[:40]}: nests tables or arrays deeper "
                            f"than {files.MAX_DEPTH} levels") from None
    files.check_depth(value, f"--set {key.strip()[:40]}")
    return split_key(key, "--set"), value


def _pool(data: dict, name: str, where: str) -> dict:
    """The ``[[pools]]`` entry called ``name`` (a pool without a name is called "pool")."""
    pools = data.get("pools")
    entries = pools if isinstance(pools, list) else []
    names = [p.get("name", "pool") for p in entries if isinstance(p, dict)]
    for p in entries:
        if isinstance(p, dict) and p.get("name", "pool") == name:
            return p
    raise ScenarioError(f"{where}: {name!r} is not a pool of the scenario (allowed: "
                        f"{', '.join(names) or 'none: it has no [[pools]]'})")


def _table(data: dict, path: list[str], where: str, create: bool) -> dict | None:
    """The table holding the last name of ``path`` (None if absent and not ``create``)."""
    node, parts = data, path
    if path[0] == "pools":
        if len(path) < 3:
            raise ScenarioError(f"{where}: expected pools.<pool name>.<key> "
                                f"(e.g. pools.decode.tp)")
        node, parts = _pool(data, path[1], where), path[2:]
    for part in parts[:-1]:
        if part not in node and not create:
            return None
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ScenarioError(f"{where}: {part} is not a table")
    return node


def set_key(data: dict, path: list[str], value: Any, where: str) -> None:
    """Set the key at ``path`` in ``data`` (in place), creating the tables on the way."""
    _table(data, path, where, create=True)[path[-1]] = value


def unset_key(data: dict, path: list[str], where: str) -> None:
    """Remove the key at ``path`` from ``data`` (in place).

    Raises
    ------
    ScenarioError
        If the scenario does not set that key (an unset that does nothing is a typo).
    """
    node = _table(data, path, where, create=False)
    if node is None or path[-1] not in node:
        raise ScenarioError(f"{where}: the scenario does not set this key (nothing to unset)")
    del node[path[-1]]


def apply_overrides(data: dict, overrides: list[str] | None,
                    unsets: list[str] | None = None) -> dict:
    """A copy of ``data`` with the ``--unset`` keys removed, then the ``--set``
    ``key.path=value`` overrides applied (so ``--unset`` of a key that ``--set`` also names
    is a no-op: the flag wins)."""
    data = copy.deepcopy(data)
    for key in unsets or []:
        unset_key(data, split_key(key, "--unset"), f"--unset {key}")
    for text in overrides or []:
        path, value = parse_set(text)
        set_key(data, path, value, f"--set {text}")
    return data
