"""Parameter sweeps: a grid of scenario overrides x seeds -> one row per run, in a CSV that
is appended as runs finish, so nothing finished is lost and reruns resume.

A grid maps dotted scenario keys to lists of values; the runs are the product of those
lists (and of zipped groups, whose lists vary together) times the seeds::

    "parallel.tp" = [2, 4, 8]
    "workload.rate_per_s" = [1, 2, 4]
    [zip.layout]                       # varied together, not crossed
    "parallel.tp" = [4, 8]
    "parallel.dp" = [4, 2]

A ``[[pools]]`` entry is addressed by its name: ``"pools.decode.tp" = [4, 8]``,
``"pools.prefill.engine.max_num_seqs" = [64, 128]``. A sweep over a scenario with pools
adds the pool summary keys (:data:`simulator.metrics.pools.POOL_SUMMARY_KEYS`) and one
``pool_utilization_<pool>`` column per pool.

Backends: ``local`` (a process pool) or ``ray`` (one Ray task per run, one CPU each).

Ctrl-C stops a sweep at once: running points are abandoned (their workers terminated, Ray
tasks cancelled), finished rows stay in the CSV, and :class:`SweepInterrupted` says how
many. A CSV whose last line was cut by a hard kill has that line dropped on resume.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from simulator import files
from simulator.arguments import MAX_JOBS
from simulator.cluster.running import run
from simulator.errors import ScenarioError
from simulator.io.gateway import GATEWAY_KEYS
from simulator.io.overrides import set_key
from simulator.io.scenario import _did_you_mean, load_scenario, read_toml
from simulator.io.schema import SECTIONS, TOP_LEVEL, AutoscaleKeys, EngineKeys, PoolKeys
from simulator.metrics.day import (
    AUTOSCALE_SUMMARY_KEYS,
    GATEWAY_CLASS_KEYS,
    GATEWAY_SUMMARY_KEYS,
)
from simulator.metrics.pools import POOL_SUMMARY_KEYS, flat_pool_metrics, pool_columns
from simulator.metrics.summary import SUMMARY_KEYS

BACKENDS = ("local", "ray")
#: Most runs (grid points x seeds) one sweep may have; checked before any run is built.
MAX_RUNS = 100_000
STATUS_COLUMNS = ["seed", "status", "error"]
#: A cell starting with one of these is run as a formula by spreadsheets (CSV injection).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: ``done`` of ``total`` runs are in ``out`` (None: not kept)."""

    def __init__(self, done: int, total: int, out: Path | None):
        super().__init__(f"{done} of {total} runs done")
        self.done, self.total, self.out = done, total, out


# -- grids -------------------------------------------------------------------------------
def _known_key(key: str) -> str | None:
    """None if ``key`` names a scenario key, else what is wrong with it."""
    parts = key.split(".")
    if len(parts) == 1:
        return None if key in TOP_LEVEL else "unknown key" + _did_you_mean(key, TOP_LEVEL)
    section = parts[0]
    if section == "pools":  # pools.<pool name>.<key>[.<engine key>]; the name is checked
        if len(parts) < 3:  # against the base scenario by sweep()
            return "expected pools.<pool name>.<key> (e.g. pools.decode.tp)"
        fields = PoolKeys.__dataclass_fields__
        if parts[2] not in fields:
            return "unknown key" + _did_you_mean(parts[2], list(fields))
        if parts[2] == "engine" and (len(parts) != 4
                                     or parts[3] not in EngineKeys.__dataclass_fields__):
            return ("unknown key" + _did_you_mean(parts[3], list(EngineKeys.__dataclass_fields__))
                    if len(parts) == 4 else "expected pools.<pool name>.engine.<key>")
        auto = AutoscaleKeys.__dataclass_fields__  # a pool's autoscale table
        if parts[2] == "autoscale" and (len(parts) != 4 or parts[3] not in auto):
            return ("unknown key" + _did_you_mean(parts[3], list(auto)) if len(parts) == 4
                    else "expected pools.<pool name>.autoscale.<key>")
        return None
    if section == "autoscale":  # [autoscale] (docs/autoscaling.md)
        fields = AutoscaleKeys.__dataclass_fields__
        return None if parts[1] in fields else "unknown key" + _did_you_mean(parts[1],
                                                                             list(fields))
    if section == "gateway":  # [gateway]'s own keys; its classes are a list, not swept
        if parts[1] == "classes" or parts[1] not in GATEWAY_KEYS:
            allowed = [k for k in GATEWAY_KEYS if k != "classes"]
            return "not a key a sweep may vary" + _did_you_mean(parts[1], allowed) + \
                f" (allowed: {', '.join(allowed)})"
        return None
    if section not in SECTIONS:
        return "unknown section" + _did_you_mean(section, [*SECTIONS, "autoscale", "gateway"])
    fields = SECTIONS[section].__dataclass_fields__
    if parts[1] not in fields:
        return "unknown key" + _did_you_mean(parts[1], list(fields))
    return None  # deeper parts (length tables) are checked when the point is loaded


def _hashable(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def parse_grid(grid: dict | str | Path) -> list[list[dict[str, Any]]]:
    """Axes of a grid: each axis is a list of ``{key: value}`` points (a plain key gives one
    key per point, a zip group several). The runs are the product of the axes.

    Raises
    ------
    ScenarioError
        Naming the grid key: not a scenario key, not a non-empty list, zipped lists of
        unequal length.
    """
    source = None
    if not isinstance(grid, dict):
        source = str(grid)
        grid = read_toml(grid)
    problems, axes = [], []

    def check(key: str, values: Any, where: str, unique: bool = True) -> bool:
        why = _known_key(key)
        if why:
            problems.append(f"{where}{key}: {why}")
        elif not isinstance(values, list) or not values:
            problems.append(f"{where}{key}: expected a non-empty list of values, got {values!r}")
        elif unique and len(seen := {_hashable(v) for v in values}) < len(values):
            twice = [v for i, v in enumerate(values)
                     if _hashable(v) in {_hashable(u) for u in values[:i]}]
            problems.append(f"{where}{key}: {twice[0]!r} is listed twice (each value runs "
                            f"once; {len(seen)} distinct of {len(values)})")
        else:
            return True
        return False

    for key, values in grid.items():
        if key == "zip":
            if not isinstance(values, dict):
                problems.append("zip: expected tables of keys to vary together")
                continue
            for name, group in values.items():
                if not isinstance(group, dict) or not group:
                    problems.append(f"zip.{name}: expected a table of key = [values]")
                    continue
                ok = [check(k, v, f"zip.{name}.", unique=False) for k, v in group.items()]
                lengths = {len(v) for v in group.values() if isinstance(v, list)}
                if all(ok) and len(lengths) > 1:
                    problems.append(f"zip.{name}: lists must have equal lengths, got "
                                    f"{sorted(lengths)}")
                elif all(ok):
                    n = lengths.pop()
                    points = [{k: v[i] for k, v in group.items()} for i in range(n)]
                    keys = [_hashable(p) for p in points]
                    if len(set(keys)) < n:
                        twice = next(p for i, p in enumerate(points) if keys[i] in keys[:i])
                        problems.append(f"zip.{name}: the point {twice} is listed twice "
                                        f"(each point runs once)")
                    else:
                        axes.append(points)
        elif check(key, values, ""):
            axes.append([{key: v} for v in values])
    if problems:
        raise ScenarioError(problems, source=source)
    return axes


def grid_points(axes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every point of the grid: the product of the axes, each a ``{key: value}`` dict."""
    return [dict(item for part in combo for item in part.items())
            for combo in itertools.product(*axes)]


# -- one run -----------------------------------------------------------------------------
def resolve_point(base: dict, point: dict[str, Any], seed: int) -> dict:
    data = copy.deepcopy(base)
    for key, value in point.items():
        set_key(data, key.split("."), value, key)
    data["seed"] = seed
    return data


def run_id(resolved: dict) -> str:
    """Identity of a run: a hash of its resolved scenario (seed included)."""
    text = json.dumps({k: v for k, v in resolved.items() if not k.startswith("_")},
                      sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _day_columns(base: dict, keys: list[str]) -> list[str]:
    """The autoscaling columns when the base scenario autoscales (a pool of it included)
    or the grid sets ``autoscale.*`` (or a pool's); the gateway's, per class of the
    base's gateway, when it has one."""
    out = []
    pools = base.get("pools") if isinstance(base.get("pools"), list) else []
    if ("autoscale" in base or any(isinstance(p, dict) and "autoscale" in p for p in pools)
            or any(k.startswith("autoscale.") or ".autoscale." in k for k in keys)):
        out += AUTOSCALE_SUMMARY_KEYS
    gateway = base.get("gateway")
    if isinstance(gateway, dict):
        names = [c.get("name") for c in gateway.get("classes", [{"name": "default"}])
                 if isinstance(c, dict)]
        out += [f"class_{n}_{k}" for n in names for k in GATEWAY_CLASS_KEYS]
        out += GATEWAY_SUMMARY_KEYS
    return out


def run_point(resolved: dict) -> dict[str, Any]:
    """Run one resolved scenario; never raises: failures become ``status = "error"``."""
    t0 = time.perf_counter()
    try:
        result = run(load_scenario(resolved))
        row = {"status": "ok", "error": "", **result.summary,
               **flat_pool_metrics(result.summary)}
    except Exception as exc:  # a failing point is recorded and the sweep goes on
        message = exc.render() if isinstance(exc, ScenarioError) else f"{type(exc).__name__}: {exc}"
        row = {"status": "error", "error": message.replace("\n", "; "),
               "wall_time_s": time.perf_counter() - t0}
    return row


# -- backends ----------------------------------------------------------------------------
def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which terminates them (a terminal sends
    SIGINT to the whole process group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_job(job: tuple[Any, Any, Any]) -> tuple[Any, Any]:
    fn, rid, resolved = job
    return rid, fn(resolved)


def _local(jobs: Iterable[tuple[str, dict]], workers: int,
           fn=run_point) -> Iterator[tuple[str, dict]]:
    jobs = list(jobs)
    if workers <= 1 or len(jobs) <= 1:
        for rid, resolved in jobs:
            yield rid, fn(resolved)
        return
    pool = multiprocessing.get_context().Pool(min(workers, len(jobs)),
                                              initializer=_ignore_sigint)
    try:
        yield from pool.imap_unordered(_run_job, [(fn, rid, r) for rid, r in jobs])
        pool.close()
    finally:
        pool.terminate()  # Ctrl-C or an early stop: abandon the points still running
        pool.join()


def _ray(jobs: Iterable[tuple[str, dict]], address: str | None,
         fn=run_point) -> Iterator[tuple[str, dict]]:
    try:
        import ray  # noqa: PLC0415 - optional extra: pip install -e .[ray]
    except ImportError:
        raise ScenarioError("--backend ray: Ray is not installed "
                            "(pip install -e '.[ray]')") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    pending: dict = {}
    try:
        task = ray.remote(num_cpus=1)(fn)
        pending = {task.remote(resolved): rid for rid, resolved in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        # Ctrl-C: stop the tasks still queued or running. A local cluster this sweep started
        # goes down with them (shutdown); cancelling first races with replies in flight and
        # trips a fatal check in Ray 2.60's task manager ("Tried to complete task that was
        # not pending"), which ends the driver with status 1.
        if started:
            ray.shutdown()
        else:
            for ref in pending:
                ray.cancel(ref)


def run_many(fn, jobs: Iterable[tuple[Any, Any]], backend: str = "local",
             workers: int | None = None,
             address: str | None = None) -> Iterator[tuple[Any, Any]]:
    """``(key, fn(job))`` for each ``(key, job)``, in the order they finish, on a backend:
    ``local`` (a process pool of ``workers``, default the CPUs; 1 runs in this process)
    or ``ray`` (one task per job, on the cluster at ``address`` or a local one). ``fn``
    must be a module-level function (pickled to the workers). Closing the iterator (or
    Ctrl-C) stops the work still running."""
    if backend not in BACKENDS:
        raise ScenarioError(f"--backend: {backend!r} is not a backend (allowed: "
                            f"{', '.join(BACKENDS)})")
    if backend == "ray":
        return _ray(jobs, address, fn)
    return _local(jobs, workers or os.cpu_count() or 1, fn)


# -- the sweep ---------------------------------------------------------------------------
def _base(scenario: str | Path | dict) -> dict:
    if isinstance(scenario, dict):
        data = copy.deepcopy(scenario)
        data.setdefault("_base_dir", os.getcwd())
        return data
    data = read_toml(scenario)
    data["_base_dir"] = str(Path(scenario).resolve().parent)
    data["_source"] = str(scenario)
    return data


def _cell(value: Any) -> Any:
    """A CSV cell: NaN empty, tables as JSON, and a string a spreadsheet would run as a
    formula (``=HYPERLINK(...)``) prefixed with ``'`` so that it shows as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def _header(path: Path) -> list[str]:
    """The first line of a CSV as its fields (no more of the file is read)."""
    files.regular_file(path, "--out", files.MAX_DATA_BYTES)
    with path.open("rb") as fh:
        first = fh.readline(2**20).decode("utf-8", errors="replace")
    return next(csv.reader([first.rstrip("\r\n")]), [])


def drop_partial_row(path: Path, n_columns: int) -> bool:
    """Cut a last line that a hard kill left unfinished (no newline, or too few fields).

    Returns
    -------
    bool
        True if a partial row was dropped.
    """
    data = path.read_bytes()
    if not data:
        return False
    body = data if data.endswith(b"\n") else data + b"\n"
    cut = body.rstrip(b"\r\n").rfind(b"\n") + 1  # start of the last line
    last = body[cut:].decode(errors="replace")
    fields = next(csv.reader([last.rstrip("\r\n")]), [])
    if data.endswith(b"\n") and len(fields) == n_columns:
        return False
    with path.open("r+b") as fh:
        fh.truncate(cut)
    return True


def sweep(scenario: str | Path | dict, grid: dict | str | Path, *, seeds: int | list[int] = 1,
          jobs: int | None = None, backend: str = "local", out: str | Path | None = None,
          ray_address: str | None = None, progress: bool = False) -> pd.DataFrame:
    """Run every grid point for every seed and return one row per run.

    Parameters
    ----------
    scenario : path or dict
        The base scenario; grid values override its keys.
    grid : dict or path
        Dotted keys to lists (see the module docstring).
    seeds : int or list of int
        ``n`` means seeds 0..n-1 (replacing the scenario's seed).
    jobs : int, optional
        Local worker processes (default: the CPUs).
    backend : {"local", "ray"}
    out : path, optional
        CSV appended as runs finish; rows whose run id is already there are skipped
        (resume). Without it nothing is written.
    ray_address : str, optional
        Ray cluster to join (default: start a local one).

    Returns
    -------
    DataFrame
        Columns: run_id, the swept keys, seed, status, error, then every summary metric.
        With ``out``, the whole CSV (earlier rows included).
    """
    if backend not in BACKENDS:
        raise ScenarioError(f"--backend: {backend!r} is not a backend (allowed: "
                            f"{', '.join(BACKENDS)})")
    base = _base(scenario)
    pools = [p.name for p in load_scenario(base).pools]  # the base itself must be valid
    axes = parse_grid(grid)
    keys = list(dict.fromkeys(k for axis in axes for point in axis for k in point))
    bad = [k for k in keys if k.startswith("pools.") and k.split(".")[1] not in pools]
    if bad:
        raise ScenarioError([f"{k}: {k.split('.')[1]!r} is not a pool of the scenario "
                             f"(allowed: {', '.join(pools) or 'none: it has no [[pools]]'})"
                             for k in bad])
    if isinstance(seeds, int) and seeds < 1:
        raise ScenarioError(f"--seeds: {seeds} runs nothing; give at least 1 (seeds 0..N-1)")
    n_seeds = seeds if isinstance(seeds, int) else len(seeds)
    n_runs = math.prod(len(axis) for axis in axes) * n_seeds  # before building any run
    if n_runs > MAX_RUNS:
        raise ScenarioError(f"--seeds: {n_seeds} seed(s) x {n_runs // n_seeds} grid point(s) "
                            f"= {n_runs} runs, above the {MAX_RUNS} a sweep may have; split "
                            f"the grid")
    if jobs is not None and not 1 <= jobs <= MAX_JOBS:
        raise ScenarioError(f"--jobs: {jobs} worker processes; give 1 to {MAX_JOBS} (omit it "
                            f"for one per CPU)")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list or len(set(seed_list)) < len(seed_list):
        raise ScenarioError(f"--seeds: {seed_list} must be a non-empty list of distinct seeds")
    columns = ["run_id", *keys, *STATUS_COLUMNS, *SUMMARY_KEYS]
    if pools:
        columns += [*POOL_SUMMARY_KEYS, *pool_columns(pools)]
    columns += _day_columns(base, keys)
    runs = []
    for point in grid_points(axes):
        for seed in seed_list:
            resolved = resolve_point(base, point, seed)
            runs.append((run_id(resolved), point, seed, resolved))
    done_ids: set[str] = set()
    path = None if out is None else files.out_file(out, "--out")
    if path is not None and path.exists() and path.stat().st_size > 0:
        # The file must be this sweep's before anything in it is touched: a user's own CSV
        # or another sweep's keeps every byte.
        if _header(path) != columns:
            raise ScenarioError(f"--out: {str(path)!r} is not this sweep's results file (its "
                                f"header differs); choose another file")
        if drop_partial_row(path, len(columns)):
            print(f"sweep: dropped the partial last row of {path} (cut by an interrupted "
                  f"write); that run goes again", file=sys.stderr)
        existing = pd.read_csv(path, dtype={"run_id": str})
        done_ids = set(existing["run_id"])
    todo = [r for r in runs if r[0] not in done_ids]
    meta = {rid: (point, seed) for rid, point, seed, _ in todo}
    rows: list[dict] = []
    fh = writer = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        fh = path.open("a", newline="")
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        if new:
            writer.writeheader()
            fh.flush()
    jobs_iter = ((rid, resolved) for rid, _, _, resolved in todo)
    stream = run_many(run_point, jobs_iter, backend, jobs, ray_address)
    failures = 0
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), unit="run", desc="sweep",
               disable=not progress)
    try:
        for rid, result in stream:
            point, seed = meta[rid]
            row = {"run_id": rid, **point, "seed": seed, **result}
            rows.append(row)
            failures += row["status"] != "ok"
            if writer is not None:
                writer.writerow({k: _cell(row.get(k, "")) for k in columns})
                fh.flush()
            bar.update(1)
            bar.set_postfix_str(f"failed={failures}")
    except KeyboardInterrupt:
        stream.close()  # terminate the workers / cancel the tasks before reporting
        raise SweepInterrupted(len(runs) - len(todo) + len(rows), len(runs), path) from None
    finally:
        bar.close()
        if fh is not None:
            fh.close()
    if path is not None:
        df = pd.read_csv(path, dtype={"run_id": str})
    else:
        df = pd.DataFrame(rows, columns=columns)
        order = {rid: i for i, (rid, *_rest) in enumerate(runs)}
        df = df.sort_values("run_id", key=lambda s: s.map(order), ignore_index=True)
    df.attrs["ran"] = len(rows)  # runs this call simulated (the rest were in ``out``)
    return df
