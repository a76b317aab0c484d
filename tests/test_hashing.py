"""simulator.hashing: SplitMix64, the package's one 64-bit mixer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.hashing import GOLDEN, MASK, finalize, golden_multiple, splitmix64

ROOT = Path(__file__).parent.parent


def test_splitmix64_gives_the_reference_sequence_from_seed_zero():
    # The published outputs of SplitMix64 seeded with 0 (Vigna's splitmix64.c): state
    # advances by GOLDEN, each output is splitmix64 of the previous state.
    state, out = 0, []
    for _ in range(3):
        out.append(splitmix64(state))
        state = (state + GOLDEN) & MASK
    assert out == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_the_array_finalizer_matches_the_scalar_step():
    xs = [0, 1, 2**63, MASK, 123456789]
    got = finalize(np.array([(x + GOLDEN) & MASK for x in xs], dtype=np.uint64))
    assert [int(v) for v in got] == [splitmix64(x) for x in xs]
    assert int(golden_multiple(np.array([3]))[0]) == (3 * GOLDEN) & MASK


def test_the_constants_live_in_one_module():
    homes = [p.relative_to(ROOT).as_posix() for p in (ROOT / "simulator").rglob("*.py")
             if "9E3779B97F4A7C15" in p.read_text().upper()]
    assert homes == ["simulator/hashing.py"]
