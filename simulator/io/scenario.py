"""Read a scenario (TOML file or dict), apply overrides, validate everything at once.

Every problem names its key and what is allowed; all problems are reported together in one
:class:`~simulator.errors.ScenarioError`. Cross-checks that need the model or the cluster
(tp divides the heads, the model fits) happen when the cluster is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from pathlib import Path
from typing import Any

from simulator import files, registry
from simulator.errors import ScenarioError
from simulator.io.gateway import parse_gateway
from simulator.io.layout import translate
from simulator.io.overrides import apply_overrides
from simulator.io.profiles import apply_profile
from simulator.io.schema import (
    LENGTH_DISTS,
    LIMITS,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_TIME_S,
    MAX_TOKENS,
    NAME_PATTERN,
    SECTIONS,
    TOP_LEVEL,
    AutoscaleKeys,
    EngineKeys,
    FaultSpec,
    ParallelKeys,
    PoolKeys,
    RandomFaults,
    Scenario,
    SpeculativeKeys,
)
from simulator.model.spec import load_model
from simulator.workload.profile import PROFILED, parse_profile

#: Keys each length distribution takes; the first ones listed are required.
DIST_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "constant": (("value",), ()),
    "uniform": (("min", "max"), ()),
    "normal": (("mean", "std"), ("min", "max")),
    "lognormal": (("mean", "sigma"), ("min", "max")),
    "exponential": (("mean",), ("min", "max")),
}


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(options)})"


def _type_name(value: Any) -> str:
    return type(value).__name__


#: Bounds of the numbers in a length distribution table (tokens; sigma in log space).
DIST_BOUNDS = {"value": (1, MAX_TOKENS), "min": (1, MAX_TOKENS), "max": (1, MAX_TOKENS),
               "mean": (1, MAX_TOKENS), "std": (0, MAX_TOKENS), "sigma": (0, 10)}
#: Keys of a distribution table that count tokens, so must be whole numbers.
DIST_INTEGERS = ("value", "min", "max")


def _check_length(key: str, value: Any, problems: list[str]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, dict)):
        problems.append(f"{key}: expected a positive integer or a table like "
                        f"{{ dist = \"lognormal\", mean = 256, sigma = 0.5 }}, got "
                        f"{_excerpt(value)}")
        return
    if isinstance(value, int):
        if not 1 <= value <= MAX_TOKENS:
            problems.append(f"{key}: must be an integer in [1, {MAX_TOKENS}] tokens, got {value}")
        return
    dist = value.get("dist")
    if dist not in DIST_KEYS:
        problems.append(f"{key}.dist: {_excerpt(dist)} is not a distribution"
                        + _did_you_mean(str(dist), LENGTH_DISTS))
        return
    required, optional = DIST_KEYS[dist]
    allowed = ("dist",) + required + optional
    for k, v in value.items():
        if k not in allowed:
            problems.append(f"{key}.{k}: unknown key for dist = \"{dist}\""
                            + _did_you_mean(k, allowed))
            continue
        if k == "dist":
            continue
        lo, hi = DIST_BOUNDS[k]
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                or not lo <= v <= hi):
            problems.append(f"{key}.{k}: expected a finite number in [{lo}, {hi}], got "
                            f"{_excerpt(v)}")
        elif k in DIST_INTEGERS and v != int(v):
            problems.append(f"{key}.{k}: expected a whole number of tokens, got {v}")
    for k in required:
        if k not in value:
            problems.append(f"{key}.{k}: required for dist = \"{dist}\"")
    lo, hi = value.get("min", 1), value.get("max", float("inf"))
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and hi < max(lo, 1):
        problems.append(f"{key}: max ({hi}) must be >= min ({lo}) and >= 1")


def _excerpt(value: Any, limit: int = 40) -> str:
    """A value as a short, printable excerpt (repr, control characters escaped, cut)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def key_bounds(key: str) -> dict:
    """The allowed range of a numeric key, e.g. ``key_bounds("workload.rate_per_s")`` ->
    ``{"gt": 0.0, "min": 1e-06, "max": 1e6}`` (``faults.random.*`` for random faults)."""
    section, _, name = key.rpartition(".")
    cls = RandomFaults if section == "faults.random" else SECTIONS[section]
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}[name]
    return _bounds(key, meta)


def _bounds(key: str, meta) -> dict:
    """The field's ``gt``/``min``/``max``, with :data:`LIMITS` for its dotted key."""
    general = re.sub(r"^faults(\[\d+\])?\.", "faults.", key)
    return {k: v for k, v in {**meta, **LIMITS.get(general, {})}.items()
            if k in ("gt", "min", "max")}


def _range_problem(key: str, value: float, bounds: dict) -> str | None:
    """One line when ``value`` is outside ``bounds``, stating the whole allowed range."""
    if "min" in bounds and bounds["min"] > bounds.get("gt", -math.inf):
        lo = f"[{bounds['min']:g}"
    else:
        lo = f"({bounds['gt']:g}" if "gt" in bounds else "(-inf"
    allowed = f"{lo}, {bounds['max']:g}]" if "max" in bounds else f"{lo}, inf)"
    for rule, bad in (("gt", value <= bounds.get("gt", -math.inf)),
                      ("min", value < bounds.get("min", -math.inf)),
                      ("max", value > bounds.get("max", math.inf))):
        if bad:
            sign = {"gt": ">", "min": ">=", "max": "<="}[rule]
            return f"{key}: must be {sign} {bounds[rule]:g}, got {value:g} (allowed: {allowed})"
    return None


def _check_value(key: str, f: dataclasses.Field, value: Any, problems: list[str]) -> Any:
    meta = f.metadata
    if value is None:
        if meta.get("optional"):
            return None
        problems.append(f"{key}: a value is required")
        return f.default
    kind = meta.get("kind")
    if kind == "length":
        _check_length(key, value, problems)
        return value
    if kind == "acceptance":  # a number or a list: checked in _speculative_problems
        return value
    if kind == "pool_speculative":  # false or a table: checked in _pool_speculative
        if value is True or not isinstance(value, (bool, dict)):
            problems.append(f"{key}: expected false (this pool does not speculate) or a table "
                            f"of [speculative] keys, got {_type_name(value)} {_excerpt(value)}")
            return f.default
        return value
    if kind == "table":
        if not isinstance(value, dict):
            problems.append(f"{key}: expected a table, got {_type_name(value)} {value!r}")
            return f.default
        return value
    base = f.type if isinstance(f.type, type) else str(f.type).split(" ")[0].split("|")[0]
    base = {"int": int, "float": float, "str": str, "bool": bool}.get(base, base)
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, base) and not (base is int and isinstance(value, bool))
    if not ok:
        problems.append(f"{key}: expected {base.__name__}, got {_type_name(value)} "
                        f"{_excerpt(value)}")
        return f.default
    if base is float and not math.isfinite(value):
        problems.append(f"{key}: expected a finite number, got {value}")
        return f.default
    if "choices" in meta and value not in meta["choices"]:
        problems.append(f"{key}: {_excerpt(value)} is not allowed"
                        + _did_you_mean(value, meta["choices"]))
    if base in (int, float):
        bad = _range_problem(key, value, _bounds(key, meta))
        if bad:
            problems.append(bad)
            return f.default
    return value


def _build_section(name: str, cls: type, raw: Any, problems: list[str]):
    if not isinstance(raw, dict):
        problems.append(f"{name}: expected a table, got {_type_name(raw)}")
        return cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in fields:
            problems.append(f"{name}.{k}: unknown key" + _did_you_mean(k, fields))
    values = {}
    for fname, f in fields.items():
        if fname in raw:
            values[fname] = _check_value(f"{name}.{fname}", f, raw[fname], problems)
    return cls(**values)


def read_toml(path: str | Path) -> dict:
    """A scenario or grid TOML file: a regular file of at most
    :data:`~simulator.files.MAX_CONFIG_BYTES`, nested at most
    :data:`~simulator.files.MAX_DEPTH` levels (:mod:`simulator.files`)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ScenarioError("scenario file not found", source=str(path))
    if path.is_dir():
        raise ScenarioError("the scenario path is a directory, not a TOML file",
                            source=str(path))
    data = files.read_bytes(path, "scenario file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"not valid TOML: not UTF-8 text (byte {exc.start})",
                            source=str(path)) from None
    try:
        return files.parse_toml(text, "scenario")
    except ScenarioError as exc:
        raise ScenarioError(exc.problems[0].removeprefix("scenario: "),
                            source=str(path)) from None


def _release_precision(data: dict, base_dir: str) -> dict:
    """``model.weight_dtype`` left unset: the precision the release ships its attention
    in (``quantization_config`` / ``hf_quant_config.json``: a block-FP8 DeepSeek runs FP8,
    not 16-bit), else the schema's bf16. A model that does not load is left to the
    model section's own check."""
    model = data.get("model")
    if not isinstance(model, dict) or "weight_dtype" in model or not isinstance(
            model.get("name"), str):
        return data
    try:
        quant = load_model(model["name"], base_dir).quant
    except ScenarioError:
        return data
    if quant is None or quant.attention == "bf16":
        return data
    return data | {"model": model | {"weight_dtype": quant.attention}}


def load_scenario(source: str | Path | dict | Scenario,
                  overrides: list[str] | None = None,
                  seed: int | None = None, unsets: list[str] | None = None) -> Scenario:
    """Validate a scenario given as a TOML path, a dict, or an existing Scenario.

    Parameters
    ----------
    source : path, dict or Scenario
        Relative paths inside a file resolve against the file's folder; inside a dict,
        against the current directory.
    overrides : list of str, optional
        Dotted ``section.key=value`` assignments (values parsed as TOML).
    seed : int, optional
        Replaces the scenario's seed.
    unsets : list of str, optional
        Dotted keys removed before the overrides apply (``--unset workload.rate_per_s``):
        the section's default applies. :mod:`simulator.io.overrides` reads both.

    Raises
    ------
    ScenarioError
        Listing every problem found.
    """
    if isinstance(source, Scenario):
        source = to_dict(source) | {"_base_dir": source.base_dir, "_source": source.source}
    if isinstance(source, dict):
        data, base_dir, origin = dict(source), source.get("_base_dir", "."), source.get("_source")
        data.pop("_base_dir", None)
        data.pop("_source", None)
    else:
        data = read_toml(source)
        base_dir, origin = str(Path(source).resolve().parent), str(source)
    try:
        data = apply_overrides(data, overrides, unsets)
    except ScenarioError as exc:
        raise exc.with_source(origin) from None
    if overrides or unsets:  # problems may come from the flags, not the file: name both
        flags = " ".join([*(f"--unset {u if len(u) <= 64 else u[:61] + '...'}"
                            for u in unsets or []),
                          *(f"--set {o if len(o) <= 64 else o[:61] + '...'}"
                            for o in overrides or [])])
        origin = f"{origin}: {flags}" if origin else flags
    if seed is not None:
        data["seed"] = seed
    data = apply_profile(data, base_dir)  # [engine] profile: fills the engine keys not set
    data = _release_precision(data, base_dir)
    problems: list[str] = []
    faults, random_faults = _faults(data.get("faults"), problems)
    pools = _pools(data.get("pools"), problems)
    for k in data:
        if k in ("faults", "speculative", "pools", "autoscale", "gateway"):
            continue
        if k not in SECTIONS and k not in TOP_LEVEL:
            problems.append(f"{k}: unknown key" + _did_you_mean(k, [*TOP_LEVEL, *SECTIONS]))
    top = {}
    for k, typ in TOP_LEVEL.items():
        if k in data:
            v = data[k]
            if not isinstance(v, typ) or isinstance(v, bool):
                problems.append(f"{k}: expected {typ.__name__}, got {_type_name(v)} {v!r}")
            elif k == "seed" and not 0 <= v <= MAX_SEED:
                problems.append(f"seed: must be in [0, {MAX_SEED}], got {v}")
            elif k == "name" and not re.fullmatch(NAME_PATTERN, v):
                problems.append(f"name: {_excerpt(v)} is not a plain folder name (letters, "
                                f"digits, '.', '_', '+', '-'; starts with a letter or digit; "
                                f"at most 100 characters)")
            else:
                top[k] = v
    sections = {name: _build_section(name, cls, data.get(name, {}), problems)
                for name, cls in SECTIONS.items()}
    sections["parallel"] = _engine_layout(sections, str(base_dir), problems)
    spec = (_build_section("speculative", SpeculativeKeys, data["speculative"], problems)
            if "speculative" in data else None)
    # With [[pools]], decode and mixed pools speculate; prefill pools do not
    # (simulator.cluster.pools.pool_scenario).
    scale = (_build_section("autoscale", AutoscaleKeys, data["autoscale"], problems)
             if "autoscale" in data else None)
    gateway = data.get("gateway")
    if gateway is not None:
        parse_gateway(gateway, problems)
        if pools:
            problems.append("gateway: scenarios with [[pools]] have no gateway yet (remove "
                            "[gateway] or the pools)")
    scenario = Scenario(**top, **sections, faults=faults, random_faults=random_faults,
                        pools=pools, base_dir=str(base_dir), source=origin,
                        speculative=spec, autoscale=scale,
                        gateway=gateway if isinstance(gateway, dict) else None)
    already = {p.split(":", 1)[0] for p in problems}
    if "workload.duration_s" in already:
        already.add("workload.num_requests")
    problems += [p for p in _workload_problems(scenario) if p.split(":", 1)[0] not in already]
    problems += _pool_engine_problems(scenario, already)
    problems += [p for p in _autoscale_problems(scenario) + _router_problems(scenario)
                 + _pool_autoscale_problems(scenario) if p.split(":", 1)[0] not in already]
    own = _speculative_problems(spec)
    problems += [p for p in own if p.split(":", 1)[0] not in already]
    for i, pool in enumerate(pools):  # a [pools.speculative] table over the section
        if isinstance(pool.speculative, dict):
            problems += [f"pools[{i}].{p}" for p in _speculative_problems(
                pool.speculative_of(spec)) if p not in own]
    if problems:
        raise ScenarioError(problems, source=origin)
    return scenario


def _engine_layout(sections: dict, base_dir: str, problems: list[str]) -> ParallelKeys:
    """``[parallel]`` in the simulator's spelling (:func:`simulator.io.layout.translate`;
    vLLM's DP means replicas for a dense model, so the model's config is read then)."""
    def is_moe() -> bool:
        try:
            return load_model(sections["model"].name, base_dir).moe is not None
        except ScenarioError:
            return False  # the build names the model's problem

    par, found = translate(sections["parallel"], is_moe)
    problems += found
    return par


FAULT_KEYS = ("at_s", "target", "duration_s", "random")


def _faults(raw: Any, problems: list[str]) -> tuple[tuple[FaultSpec, ...], RandomFaults | None]:
    """``[[faults]]`` entries (at_s, target, duration_s) and one ``random`` table, which TOML
    places inside the last ``[[faults]]`` entry (``[faults.random]``) or alone."""
    if raw is None:
        return (), None
    entries = raw if isinstance(raw, list) else [raw]
    scheduled, random = [], None
    for i, e in enumerate(entries):
        key = f"faults[{i}]" if isinstance(raw, list) else "faults"
        if not isinstance(e, dict):
            problems.append(f"{key}: expected a table, got {_type_name(e)}")
            continue
        for k in e:
            if k not in FAULT_KEYS:
                problems.append(f"{key}.{k}: unknown key" + _did_you_mean(k, FAULT_KEYS))
        if "random" in e:
            random = _build_section(f"{key}.random", RandomFaults, e["random"], problems)
        if "at_s" in e or "target" in e:
            at, target, dur = e.get("at_s"), e.get("target"), e.get("duration_s")
            if not _is_time(at, 0.0):
                problems.append(f"{key}.at_s: expected a time in [0, {MAX_TIME_S:g}] seconds, "
                                f"got {_excerpt(at)}")
            if not isinstance(target, str) or not target.startswith(("node:", "gpu:",
                                                                     "link:")):
                problems.append(f"{key}.target: expected node:N, gpu:N or link:A-B, got "
                                f"{_excerpt(target)}")
            if dur is not None and (not _is_time(dur, 0.0) or dur == 0):
                problems.append(f"{key}.duration_s: expected seconds in (0, {MAX_TIME_S:g}] "
                                f"(omit for a permanent fault), got {_excerpt(dur)}")
            if not any(p.startswith(key + ".") for p in problems):
                scheduled.append(FaultSpec(float(at), target,
                                           None if dur is None else float(dur)))
    return tuple(scheduled), random


def _is_time(v: Any, lo: float) -> bool:
    """Whether ``v`` is a finite number of seconds in [lo, MAX_TIME_S]."""
    return (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
            and lo <= v <= MAX_TIME_S)


def _pools(raw: Any, problems: list[str]) -> tuple[PoolKeys, ...]:
    """``[[pools]]`` entries: each key checked as a section, ``engine`` overrides checked
    against ``[engine]``, names unique, and the roles a cluster can combine: mixed pools
    alone (heterogeneous DP), or at least one prefill and one decode pool."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        problems.append(f"pools: expected an array of tables ([[pools]]), got {raw!r}")
        return ()
    pools = []
    for i, e in enumerate(raw):
        key = f"pools[{i}]"
        if not isinstance(e, dict):
            problems.append(f"{key}: expected a table, got {_type_name(e)}")
            continue
        pool = _build_section(key, PoolKeys, e, problems)
        if not re.fullmatch(NAME_PATTERN, pool.name):  # it names CSV columns and files
            problems.append(f"{key}.name: {_excerpt(pool.name)} is not a plain name "
                            f"(letters, digits, '.', '_', '+', '-'; starts with a letter or "
                            f"digit; at most 100 characters)")
        if isinstance(pool.engine, dict):
            if "profile" in pool.engine:
                problems.append(f"{key}.engine.profile: not allowed per pool (set [engine] "
                                f"profile for the whole cluster)")
            _build_section(f"{key}.engine", EngineKeys, pool.engine, problems)
        pools.append(_pool_autoscale(key, _pool_speculative(key, pool, problems), problems))
    names = [p.name for p in pools]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"pools.name: {n!r} names more than one pool (names must be unique)")
    roles = {p.role for p in pools}
    if "mixed" in roles and roles != {"mixed"}:
        problems.append("pools.role: mixed pools cannot be combined with prefill or decode "
                        "pools (allowed: only mixed pools, or prefill and decode pools)")
    elif "decode" in roles and "prefill" not in roles:
        problems.append("pools.role: a decode pool needs a prefill pool (add a [[pools]] "
                        "entry with role = \"prefill\")")
    elif "prefill" in roles and "decode" not in roles:
        problems.append("pools.role: a prefill pool needs a decode pool (add a [[pools]] "
                        "entry with role = \"decode\")")
    return tuple(pools)


def _pool_speculative(key: str, pool: PoolKeys, problems: list[str]) -> PoolKeys:
    """``pool`` with its ``speculative`` table checked as a ``[speculative]`` section and
    kept as the checked values of the keys it sets (``PoolKeys.speculative_of`` lays them
    over the scenario's section); a prefill pool may not set it."""
    if pool.speculative is None:
        return pool
    if pool.role == "prefill":
        problems.append(f"{key}.speculative: a prefill pool never speculates (it emits one "
                        f"token per request and holds no drafter), got "
                        f"{_excerpt(pool.speculative)}; allowed on decode and mixed pools")
        return dataclasses.replace(pool, speculative=None)
    if not isinstance(pool.speculative, dict):
        return pool
    own: list[str] = []
    checked = _build_section("speculative", SpeculativeKeys, pool.speculative, own)
    problems += [f"{key}.{p}" for p in own]
    keys = {k: getattr(checked, k) for k in pool.speculative if hasattr(checked, k)}
    return dataclasses.replace(pool, speculative=keys)


def _pool_autoscale(key: str, pool: PoolKeys, problems: list[str]) -> PoolKeys:
    """``pool`` with its ``autoscale`` table checked as an ``[autoscale]`` section and kept
    as the checked values of the keys it sets (``PoolKeys.autoscale_of``); its bounds are
    checked against the pool's ``dp`` in :func:`_pool_autoscale_problems`."""
    if not isinstance(pool.autoscale, dict):
        return pool
    own: list[str] = []
    checked = _build_section("autoscale", AutoscaleKeys, pool.autoscale, own)
    problems += [f"{key}.{p}" for p in own]
    if own:
        return dataclasses.replace(pool, autoscale=None)
    keys = {k: getattr(checked, k) for k in pool.autoscale if hasattr(checked, k)}
    return dataclasses.replace(pool, autoscale=keys)


def _rate_profile_problems(w) -> list[str]:
    """``[workload.rate_profile]``: its keys, and the arrivals it may shape."""
    p: list[str] = []
    if w.arrival not in PROFILED:
        p.append(f"workload.rate_profile: shapes arrival = {', '.join(PROFILED)}, not "
                 f"\"{w.arrival}\"")
        return p
    if w.arrival != "trace" and w.rate_per_s is not None:
        p.append("workload.rate_per_s: not used with workload.rate_profile (the profile "
                 "gives the rate; remove one)")
    parse_profile(w.rate_profile, w.arrival == "trace", p)
    return p


def _workload_problems(s: Scenario) -> list[str]:
    w, p = s.workload, []
    if w.rate_profile is not None:
        p += _rate_profile_problems(w)
    elif w.arrival in ("poisson", "gamma", "constant", "sessions") and (
            w.rate_per_s is not None):
        if w.num_requests is None and w.duration_s is not None and (
                w.rate_per_s * w.duration_s > MAX_REQUESTS):
            p.append(f"workload.duration_s: rate_per_s x duration_s = "
                     f"{w.rate_per_s * w.duration_s:.3g} requests, more than the "
                     f"{MAX_REQUESTS} a run may draw (set num_requests or shorten it)")
        if w.duration_s is None and w.num_requests is not None and (
                w.num_requests / w.rate_per_s > MAX_TIME_S):
            p.append(f"workload.rate_per_s: num_requests / rate_per_s = "
                     f"{w.num_requests / w.rate_per_s:.3g} s of arrivals, beyond the "
                     f"{MAX_TIME_S:g} s a run may simulate (raise the rate or set duration_s)")
    if w.arrival in ("poisson", "gamma", "constant", "sessions") and w.rate_per_s is None \
            and w.rate_profile is None:
        p.append(f"workload.rate_per_s: required for arrival = \"{w.arrival}\" (a number > 0)")
    if w.client is not None and w.arrival != "closed_loop":
        p.append(f"workload.client: \"{w.client}\" drives a closed loop (set arrival = "
                 f"\"closed_loop\" and concurrency), not arrival = \"{w.arrival}\"")
    if w.warmup_requests is not None and w.client is None:
        p.append("workload.warmup_requests: needs a named client (workload.client)")
    if w.arrival == "closed_loop" and w.concurrency is None:
        p.append("workload.concurrency: required for arrival = \"closed_loop\" (an integer >= 1)")
    if w.arrival == "closed_loop" and w.rate_per_s is not None:
        # Release times spread over num_requests / rate_per_s, as vllm bench serve's.
        if w.num_requests is None:
            p.append("workload.num_requests: required for arrival = \"closed_loop\" with "
                     "rate_per_s (the releases span num_requests / rate_per_s seconds)")
        elif w.num_requests / w.rate_per_s > MAX_TIME_S:
            p.append(f"workload.rate_per_s: num_requests / rate_per_s = "
                     f"{w.num_requests / w.rate_per_s:.3g} s of releases, beyond the "
                     f"{MAX_TIME_S:g} s a run may simulate (raise the rate)")
    if w.arrival == "trace" and w.trace is None:
        p.append("workload.trace: required for arrival = \"trace\" (a CSV path)")
    if w.arrival != "trace" and w.num_requests is None and w.duration_s is None:
        p.append("workload.num_requests: set num_requests and/or duration_s")
    p += _routing_problems(s.model.routing)
    return p + _engine_problems(s.engine, "engine")


def _engine_problems(eng: EngineKeys, key: str) -> list[str]:
    """The engine keys that depend on each other, for ``[engine]`` and for each pool's
    engine (``[engine]`` with the pool's ``engine`` table over it)."""
    p = []
    known = eng.scheduler in registry.SCHEDULERS  # an unknown name is reported already
    accepted = tuple(registry.SCHEDULERS[eng.scheduler].PARAMS) if known else ()
    args = eng.scheduler_args or {}
    if not isinstance(args, dict):
        return [f"{key}.scheduler_args: expected a table of scheduler parameters, got "
                f"{_excerpt(args)}"]
    for k, v in args.items():
        if k not in accepted:
            took = ", ".join(accepted) if accepted else "no parameters"
            p.append(f"{key}.scheduler_args.{_excerpt(k)[1:-1]}: scheduler "
                     f"\"{eng.scheduler}\" does not take it (accepted: {took})")
        elif isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
            p.append(f"{key}.scheduler_args.{k}: expected an integer in [1, {MAX_TOKENS}], "
                     f"got {_excerpt(v)}")
    if eng.max_num_batched_tokens < eng.max_num_seqs:
        p.append(f"{key}.max_num_batched_tokens: must be >= {key}.max_num_seqs "
                 f"({eng.max_num_seqs}), got {eng.max_num_batched_tokens}")
    return p


def _pool_engine_problems(s: Scenario, already: set[str]) -> list[str]:
    """:func:`_engine_problems` of each pool whose own engine keys are valid."""
    p, names = [], {f.name for f in dataclasses.fields(EngineKeys)}
    for i, pool in enumerate(s.pools):
        key = f"pools[{i}].engine"
        if not isinstance(pool.engine, dict) or any(a.startswith(key) for a in already):
            continue
        eng = dataclasses.replace(s.engine, **{k: v for k, v in pool.engine.items()
                                               if k in names})
        p += [q for q in _engine_problems(eng, key) if q.split(":", 1)[0] not in already]
    return p


def _router_problems(s: Scenario) -> list[str]:
    if s.router.refresh_s is not None and s.pools:
        return ["router.refresh_s: scraped router views are not modelled for [[pools]] yet "
                "(remove refresh_s or the pools)"]
    return []


def _autoscale_problems(s: Scenario) -> list[str]:
    """``[autoscale]`` bounds against the layout, and what each policy needs."""
    a = s.autoscale
    if a is None:
        return []
    if s.pools:
        return ["autoscale: with [[pools]] each pool scales by its own table (set "
                "autoscale = {...} in the prefill and decode [[pools]] entries; remove "
                "[autoscale])"]
    return _scaling_problems(s, a, "autoscale", s.parallel.dp, "parallel.dp",
                             "raise parallel.dp and cluster.nodes: the fleet scaling may use")


def _scaling_problems(s: Scenario, a: AutoscaleKeys, key: str, fleet: int, fleet_key: str,
                      raise_hint: str) -> list[str]:
    """The bounds of scaling keys ``a`` (named ``key``) against the ``fleet`` replicas
    that ``fleet_key`` places, and what each policy needs."""
    p: list[str] = []
    if s.workload.arrival in ("closed_loop", "sessions"):
        p.append(f"{key}: arrival = \"{s.workload.arrival}\" paces itself by the "
                 "replies; autoscaling needs an open-loop arrival (poisson, gamma, constant, "
                 "trace)")
    top = a.max_replicas if a.max_replicas is not None else fleet
    if top > fleet:
        p.append(f"{key}.max_replicas: {top} is more than the {fleet_key} = "
                 f"{fleet} replicas the cluster holds ({raise_hint})")
    if a.min_replicas > top:
        p.append(f"{key}.min_replicas: {a.min_replicas} is more than max_replicas {top}")
    start = a.initial_replicas if a.initial_replicas is not None else a.min_replicas
    # Without initial_replicas it is min_replicas, whose own problem is the one line.
    if not a.min_replicas <= start <= top and (a.initial_replicas is not None
                                               or a.min_replicas <= top):
        p.append(f"{key}.initial_replicas: {start} is not within [min_replicas, "
                 f"max_replicas] = [{a.min_replicas}, {top}]")
    if a.scale_down_below >= 1:
        p.append(f"{key}.scale_down_below: must be < 1 (a fraction of target), got "
                 f"{a.scale_down_below:g}")
    if a.policy == "sla" and a.forecaster == "holt_winters" and a.season_intervals == 1:
        p.append(f"{key}.season_intervals: a season of 1 interval is no season (0: "
                 "none, or >= 2)")
    return p


def _pool_autoscale_problems(s: Scenario) -> list[str]:
    """Each pool's ``autoscale`` table against the pool: prefill and decode pools scale
    (mixed pools do not yet), within their own ``dp``; ``sla`` needs the replica's
    capacity, which the cost model estimates for colocated replicas only."""
    p: list[str] = []
    for i, pool in enumerate(s.pools):
        a, key = pool.autoscale_of(), f"pools[{i}].autoscale"
        if a is None:
            continue
        if pool.role == "mixed":
            p.append(f"{key}: mixed pools do not scale yet (prefill and decode pools do; "
                     f"remove autoscale from pool {pool.name!r})")
            continue
        if a.policy == "sla" and a.replica_capacity_per_s is None:
            p.append(f"{key}.replica_capacity_per_s: required with policy = \"sla\" on a "
                     f"{pool.role} pool (one replica's requests/s within the SLOs; the cost "
                     f"model estimates it for colocated replicas only)")
        p += _scaling_problems(s, a, key, pool.dp, f"pools[{i}].dp",
                               f"raise pools[{i}].dp and its nodes: the fleet the pool may use")
    return p


def _speculative_problems(sp: SpeculativeKeys | None) -> list[str]:
    """The [speculative] keys that depend on each other (method, draft, acceptance)."""
    if sp is None:
        return []
    p, k = [], sp.num_speculative_tokens
    if sp.method is None:
        p.append("speculative.method: required (draft_model, eagle, mtp or ngram)")
    if (sp.method == "draft_model") != (sp.draft_model is not None):
        p.append("speculative.draft_model: " + (
            "required for method = \"draft_model\" (a catalog model name)"
            if sp.draft_model is None else f"only for method = \"draft_model\", got "
            f"method = {sp.method!r}"))
    a, m = sp.acceptance, sp.mean_accepted_tokens
    if (a is None) == (m is None):
        p.append("speculative.acceptance: set exactly one of acceptance (a probability or a "
                 "list of k) and mean_accepted_tokens")
    elif a is not None:
        vals = a if isinstance(a, list) else [a]
        ok = all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1
                 for v in vals)
        if not ok or (isinstance(a, list) and len(a) != k):
            p.append(f"speculative.acceptance: expected a probability in [0, 1] or a list of "
                     f"num_speculative_tokens = {k} of them, got {a!r}")
    elif m > k:
        p.append(f"speculative.mean_accepted_tokens: must be <= num_speculative_tokens "
                 f"({k}), got {m}")
    return p


ROUTING_KEYS = ("distribution", "skew", "weights_file")


def _routing_problems(routing: dict | None) -> list[str]:
    """``[model.routing]``: distribution uniform | zipf, skew > 0, weights_file a path."""
    p: list[str] = []
    for k, v in (routing or {}).items():
        key = f"model.routing.{k}"
        if k not in ROUTING_KEYS:
            p.append(f"{key}: unknown key" + _did_you_mean(k, ROUTING_KEYS))
        elif k == "distribution" and v not in ("uniform", "zipf"):
            p.append(f"{key}: {v!r} is not allowed (allowed: uniform, zipf)")
        elif k == "skew" and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v) or not 0 < v <= 10):
            p.append(f"{key}: expected a number in (0, 10], got {v!r}")
        elif k == "weights_file" and not isinstance(v, str):
            p.append(f"{key}: expected a path to a file of per-expert weights, got {v!r}")
    return p


def resolve_path(scenario: Scenario, path: str) -> Path:
    """A path from the scenario, relative to the scenario file's folder."""
    p = Path(path)
    return p if p.is_absolute() else Path(scenario.base_dir) / p


def to_dict(scenario: Scenario) -> dict:
    """The scenario as plain nested dicts, without ``None`` values (TOML has no null)."""
    out: dict[str, Any] = {"name": scenario.name, "seed": scenario.seed}
    for name in SECTIONS:
        sec = dataclasses.asdict(getattr(scenario, name))
        out[name] = {k: v for k, v in sec.items() if v is not None}
    faults = [{k: v for k, v in dataclasses.asdict(f).items() if v is not None}
              for f in scenario.faults]
    if scenario.random_faults is not None:
        rnd = {k: v for k, v in dataclasses.asdict(scenario.random_faults).items()
               if v is not None}
        if faults:
            faults[-1]["random"] = rnd
        else:
            faults = [{"random": rnd}]
    if faults:
        out["faults"] = faults
    if scenario.speculative is not None:
        out["speculative"] = {k: v for k, v in dataclasses.asdict(scenario.speculative).items()
                              if v is not None}
    if scenario.gateway is not None:
        out["gateway"] = scenario.gateway
    if scenario.autoscale is not None:
        out["autoscale"] = {k: v for k, v in dataclasses.asdict(scenario.autoscale).items()
                            if v is not None}
    if scenario.pools:
        out["pools"] = [{k: v for k, v in dataclasses.asdict(p).items() if v is not None}
                        for p in scenario.pools]
    return out
