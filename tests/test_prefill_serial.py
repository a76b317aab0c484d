"""The prefill form's serial key loop: a chunk after cached tokens walks ``c + x`` keys.

``forms.prefill_time`` and ``StageCost.prefill_attention`` take the last query tile's key
loop ``K`` from the step aggregates. For a chunk of ``x`` tokens after ``c`` cached ones
the tile sees ``c + x`` keys (plus the diagonal one of the old form), not ``2c + x``: the
mean query row sees ``c + (x + 1) / 2`` keys, so ``2 pairs / tokens`` counts ``c`` twice.
Prompts from scratch (``ctx = 0``, all the H100 fit saw) keep the old value bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.calibration import forms
from simulator.calibration.params import PrefillParams

PEAK, BW, SMS, D, BQ = 1.0e15, 3.0e12, 132, 128, 128
#: Only the serial loop costs anything (the other terms are made negligible).
ONLY_SERIAL = PrefillParams(compute_eff=1e12, bandwidth_eff=1e12, block_q=BQ,
                            serial_eff=0.5)
SHAPE = forms.AttentionShape(16, 2, D, 2, PEAK, BW, SMS)
#: Seconds per key of the serial loop: 4 block_q d FLOPs at serial_eff of one SM's peak.
UNIT = 4.0 * BQ * D / (PEAK / SMS * 0.5)


def chunks(xs, cs):
    """(tokens, pairs, ctx, seqs) of prompt chunks of xs tokens after cs cached ones."""
    xs, cs = np.asarray(xs, float), np.asarray(cs, float)
    return xs.sum(), float((xs * (cs + (xs + 1) / 2)).sum()), cs.sum(), len(xs)


@pytest.mark.parametrize("x,c", [(64, 4000), (1, 2048), (512, 512), (4000, 8192)])
def test_one_chunk_after_a_cached_prefix_walks_c_plus_x_keys(x, c):
    t = forms.prefill_time(SHAPE, ONLY_SERIAL, *chunks([x], [c]))
    assert float(t) == pytest.approx(UNIT * (c + x + 1), rel=1e-6)


def test_equal_chunks_walk_c_plus_x_keys():
    t = forms.prefill_time(SHAPE, ONLY_SERIAL, *chunks([64, 64, 64], [1000, 1000, 1000]))
    assert float(t) == pytest.approx(UNIT * (1000 + 64 + 1), rel=1e-6)


def test_prompts_from_scratch_keep_the_old_form_bit_for_bit():
    p = PrefillParams(compute_eff=0.6, exp_sm_s=2e-9, block_k=128, block_q=128,
                      serial_eff=0.4, bandwidth_eff=0.8, overlap=3.0, floor_s=5e-6)
    tokens, pairs, _, seqs = chunks([300, 1200, 57], [0, 0, 0])
    floor, seq, tok, pair, waste, serial, qo, kv, ov = SHAPE.prefill_coeffs(p)
    old = floor + seq * seqs + tok * tokens + forms.combine(
        ov, (pairs + tokens * waste) * pair, serial * pairs / tokens,
        qo * tokens + kv * tokens)
    assert float(forms.prefill_time(SHAPE, p, tokens, pairs, 0, seqs)) == float(old)


def test_undercounted_chunks_fall_back_to_the_mean_rows_keys():
    # Two chunks after long prefixes counted as one sequence (a mixed step passes 1):
    # 2 pairs / tokens - ctx would be 11 keys; the loop is never shorter than the mean
    # query row's c + (x + 1) / 2 = 1005.5.
    tokens, pairs, ctx, _ = chunks([10, 10], [1000, 1000])
    t = forms.prefill_time(SHAPE, ONLY_SERIAL, tokens, pairs, ctx, 1)
    assert float(t) == pytest.approx(UNIT * 1005.5, rel=1e-6)


def test_a_verification_step_counts_its_sequences_not_its_sampled_positions():
    """Speculative verification of n sequences with k drafts samples n (k + 1) positions
    but runs n chunks of k + 1 tokens: StageCost.step takes ``seqs = n`` from the engine,
    so the key loop is ``c + k + 2`` (the mean KV c), not ``2c + k + 2 - c / (k + 1)``."""
    from simulator.hardware.specs import load_gpu
    from simulator.model.cost import StageCost
    from simulator.model.spec import load_model
    from simulator.parallel.collective import AllReduceCost

    m, g = load_model("llama-3.1-8b"), load_gpu("h100_sxm")
    cost = StageCost(m, g, 1, m.layers, True, True, "bf16", "bf16", AllReduceCost((), 1))
    n, k, c = 4, 3, 3000
    tokens, pairs, ctx = n * (k + 1), (k + 1) * n * c + n * (k + 1) * (k + 2) / 2, n * c
    by_seqs = cost.step(tokens, pairs, ctx, 0, n * (k + 1), n)
    by_sampled = cost.step(tokens, pairs, ctx, 0, n * (k + 1))
    attn = (cost.prefill_attention(tokens, pairs, ctx, n)
            - cost.prefill_attention(tokens, pairs, ctx, n * (k + 1)))
    assert attn < 0  # the shorter key loop
    assert by_seqs[0] - by_sampled[0] == pytest.approx(m.layers * attn, rel=1e-9)
    assert by_seqs[1] == by_sampled[1]
