"""``[gateway]``: request classes, admission and flow control keys (checked here; run by
:mod:`simulator.cluster.gateway`, whose docstring says what each does)."""

from __future__ import annotations

import math
from dataclasses import dataclass

ORDERS = ("fcfs", "sjf", "fair")
CLASS_KEYS = ("name", "priority", "share", "ttft_slo_s", "tpot_slo_s", "deadline_s",
              "sheddable", "rate_per_s", "burst")
GATEWAY_KEYS = ("classes", "tenants", "order", "saturation_queue", "saturation_kv",
                "max_queue")


@dataclass(frozen=True)
class RequestClass:
    name: str
    priority: int = 1
    share: float = 1.0
    ttft_slo_s: float | None = None  # None: the scenario's [slo]
    tpot_slo_s: float | None = None
    deadline_s: float | None = None
    sheddable: bool = False
    rate_per_s: float | None = None  # token bucket refill; None: no rate limit
    burst: float = 1.0


@dataclass(frozen=True)
class GatewaySpec:
    classes: tuple[RequestClass, ...]
    tenants: int = 1
    order: str = "fcfs"
    saturation_queue: int = 5
    saturation_kv: float = 0.8
    max_queue: int = 100_000


def _num(v, key: str, problems: list[str], lo: float = 0.0, positive: bool = False,
         integer: bool = False, hi: float = 1e12):
    ok = (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
          and v >= lo and (not positive or v > 0) and v <= hi
          and (not integer or float(v).is_integer()))
    if not ok:
        kind = "an integer" if integer else "a number"
        low = f"> {lo:g}" if positive and lo <= 0 else f">= {lo:g}"  # lo > 0 is allowed
        problems.append(f"{key}: expected {kind} {low} (at most {hi:g}), got "
                        f"{repr(v)[:24]}")
        return None
    return int(v) if integer else float(v)


def parse_gateway(table: dict, problems: list[str]) -> GatewaySpec | None:
    """A :class:`GatewaySpec` from ``[gateway]``; each problem one line naming its key."""
    if not isinstance(table, dict):
        problems.append("gateway: expected a table")
        return None
    for k in table:
        if k not in GATEWAY_KEYS:
            problems.append(f"gateway.{str(k)[:32]}: unknown key (allowed: "
                            f"{', '.join(GATEWAY_KEYS)})")
    raw = table.get("classes", [{"name": "default"}])
    if not isinstance(raw, list) or not raw or len(raw) > 64:
        problems.append("gateway.classes: expected a list of 1 to 64 tables "
                        "[[gateway.classes]]")
        return None
    classes, names = [], set()
    for i, c in enumerate(raw):
        key = f"gateway.classes[{i}]"
        if not isinstance(c, dict):
            problems.append(f"{key}: expected a table")
            continue
        for k in c:
            if k not in CLASS_KEYS:
                problems.append(f"{key}.{str(k)[:32]}: unknown key (allowed: "
                                f"{', '.join(CLASS_KEYS)})")
        name = c.get("name")
        if not isinstance(name, str) or not name.isidentifier() or len(name) > 32:
            problems.append(f"{key}.name: expected a plain name (letters, digits, _), got "
                            f"{str(name)[:24]!r}")
            continue
        if name in names:
            problems.append(f"{key}.name: {name!r} names two classes")
        names.add(name)
        kw = {"name": name}
        for k, lo, pos, integer in (("priority", 0, False, True), ("share", 0, True, False),
                                    ("ttft_slo_s", 0, True, False),
                                    ("tpot_slo_s", 0, True, False),
                                    ("deadline_s", 0, True, False),
                                    ("rate_per_s", 0, True, False), ("burst", 1, True, False)):
            if k in c:
                v = _num(c[k], f"{key}.{k}", problems, lo, pos, integer)
                if v is not None:
                    kw[k] = v
        if "sheddable" in c:
            if not isinstance(c["sheddable"], bool):
                problems.append(f"{key}.sheddable: expected true or false")
            else:
                kw["sheddable"] = c["sheddable"]
        classes.append(RequestClass(**kw))
    kw = {}
    for k, lo, pos, integer, hi in (("tenants", 1, True, True, 1e6),
                                    ("saturation_queue", 0, False, True, 1e9),
                                    ("saturation_kv", 0, True, False, 1.0),
                                    ("max_queue", 1, True, True, 1e7)):
        if k in table:
            v = _num(table[k], f"gateway.{k}", problems, lo, pos, integer, hi)
            if v is not None:
                kw[k] = v
    if "order" in table:
        if table["order"] not in ORDERS:
            problems.append(f"gateway.order: expected one of {', '.join(ORDERS)}, got "
                            f"{str(table['order'])[:24]!r}")
        else:
            kw["order"] = table["order"]
    return GatewaySpec(tuple(classes), **kw) if classes else None
