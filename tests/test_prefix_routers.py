"""Cache-aware routers as pure policies over fake replica views (no SimPy)."""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.cluster.router import KVAware, PrefixAware, SessionAffinity, make_router


@dataclass
class View:
    index: int
    outstanding: int = 0
    load_tokens: int = 0
    cached: dict = field(default_factory=dict)  # request id -> cached prompt tokens

    def cached_tokens(self, request) -> int:
        return self.cached.get(request.id, 0)


@dataclass
class Req:
    id: int
    session: int = -1


def test_prefix_aware_takes_the_longest_cached_prefix_then_the_least_loaded():
    views = [View(0, outstanding=1), View(1, outstanding=9, cached={7: 4096}),
             View(2, outstanding=0, cached={7: 1024})]
    assert PrefixAware().choose(views, Req(7)) == 1
    views[2].cached[7] = 4096  # a tie on the cache: fewer in flight wins
    assert PrefixAware().choose(views, Req(7)) == 2
    assert PrefixAware().choose(views, Req(8)) == 2  # nothing cached: least outstanding


def test_kv_aware_weighs_cached_tokens_against_load():
    views = [View(0, load_tokens=1000), View(1, load_tokens=9000, cached={1: 6000})]
    # Scores with weight 1: 0 - 1000 = -1000 and 6000 - 9000 = -3000.
    assert make_router("kv_aware", load_weight=1.0).choose(views, Req(1)) == 0
    # Weight 0.5: -500 against 6000 - 4500 = 1500.
    assert make_router("kv_aware", load_weight=0.5).choose(views, Req(1)) == 1
    assert KVAware(load_weight=0.0).choose(views, Req(2)) == 0  # all tied: lowest index


def test_session_affinity_is_consistent_hashing():
    views = [View(i) for i in range(8)]
    router = SessionAffinity()
    first = {s: router.choose(views, Req(1000 + s, session=s)) for s in range(2000)}
    # Every turn of a session goes to the same replica, and the sessions spread evenly.
    assert all(router.choose(views, Req(s, session=s)) == r for s, r in first.items())
    counts = [list(first.values()).count(i) for i in range(8)]
    assert min(counts) > 2000 / 8 * 0.6 and max(counts) < 2000 / 8 * 1.4
    # Replica 3 goes down: only its own sessions move (positions are into the up list).
    up = [v for v in views if v.index != 3]
    moved = 0
    for s, r in first.items():
        now = up[router.choose(up, Req(s, session=s))].index
        if r != 3:
            assert now == r
        else:
            moved += 1
    assert moved == counts[3]
    # Without a session the request id is hashed: a spread, not one replica.
    assert len({router.choose(views, Req(i)) for i in range(64)}) == 8
