"""Synthetic multi-turn sessions with shared system prompts, as block hashes.

Sessions start as a Poisson process (``rate_per_s`` sessions per second, bounded by
``num_requests`` sessions and/or ``duration_s``, as open-loop arrivals are); every turn of a
started session is sent. A session picks one of ``prefix_groups`` system prompts of
``shared_prefix_tokens`` tokens and has ``turns`` turns (a length spec); turn j sends the
whole conversation so far: system prompt + every earlier (user tokens + answer) + its new
``prompt_tokens`` user tokens, and ``output_tokens`` answer tokens are appended to the
context of the next turn. Turn j + 1 arrives an exponential think time (mean
``think_time_s``) after turn j *arrives* (an open-loop approximation: the client does not
wait for the answer).

Token identity is a chained hash per full block of ``hash_block_tokens`` tokens: block k
of a session in group g is ``("g", g, k)``-like while it lies inside the system prompt,
else it is the session's own (a chained hash differs once any earlier token differs). A
request's hashes cover its prompt and its answer, so the next turn can reuse both.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError
from simulator.io.schema import MAX_REQUESTS, MAX_TOKENS, WorkloadKeys
from simulator.workload.arrivals import arrival_times
from simulator.workload.lengths import sample_lengths

#: Hash ids: a session's block k is SESSION * s + k; a group's is -(SESSION * g + k) - 1.
SESSION = 1 << 32
#: Most block hashes a run's sessions may carry (each is a Python int in a tuple: 2^25 of
#: them take about 1.2 GB).
MAX_HASHES = 2**25


def session_requests(w: WorkloadKeys, rngs: dict[str, np.random.Generator]) -> pd.DataFrame:
    """Every turn of every session as an open-loop request table: ``arrival_s``,
    ``prompt_tokens``, ``output_tokens``, ``hashes``, ``session`` and ``turn``, sorted by
    arrival (ties keep session order)."""
    starts = arrival_times(replace(w, arrival="poisson"), rngs["arrivals"])
    n = len(starts)
    rng = rngs["sessions"]
    turns = sample_lengths(w.turns, n, rng)
    groups = rng.integers(w.prefix_groups, size=n)
    total = int(turns.sum())
    if total > MAX_REQUESTS:  # before a request is drawn
        raise ScenarioError(f"workload.turns: {n} sessions draw {total} turns in all, above "
                            f"the {MAX_REQUESTS} requests a run may have (fewer sessions or "
                            f"turns)")
    users = sample_lengths(w.prompt_tokens, total, rngs["prompts"])
    answers = sample_lengths(w.output_tokens, total, rngs["outputs"])
    think = (rng.exponential(w.think_time_s, total) if w.think_time_s > 0
             else np.zeros(total))
    session = np.repeat(np.arange(n), turns)
    first = np.concatenate(([0], np.cumsum(turns)[:-1]))  # index of each session's turn 0
    turn = np.arange(total) - np.repeat(first, turns)
    grown = users + answers
    # Context before each turn: the session's earlier turns (exclusive cumulative sum).
    before = np.cumsum(grown) - grown
    before -= np.repeat(before[first], turns)
    prompt = w.shared_prefix_tokens + before + users
    think[first] = 0.0  # turn 0 at the session's start
    waited = np.cumsum(think)
    arrival = np.repeat(starts, turns) + waited - np.repeat(waited[first], turns)
    unit, shared = w.hash_block_tokens, w.shared_prefix_tokens // w.hash_block_tokens
    context = prompt + answers
    if context.max() > MAX_TOKENS or int((context // unit).sum()) > MAX_HASHES:
        raise ScenarioError(f"workload.turns: the sessions' contexts grow to "
                            f"{int(context.max())} tokens and {int((context // unit).sum())} "
                            f"block hashes in all (allowed: {MAX_TOKENS} tokens per request, "
                            f"{MAX_HASHES} hashes per run); fewer turns or shorter ones")
    hashes = []
    for s, g, tokens in zip(session.tolist(), np.repeat(groups, turns).tolist(),
                            context.tolist(), strict=True):
        k = tokens // unit
        m = min(shared, k)
        hashes.append(tuple(range(-(SESSION * g) - 1, -(SESSION * g) - 1 - m, -1))
                      + tuple(range(SESSION * s + m, SESSION * s + k)))
    df = pd.DataFrame({"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": answers,
                       "hashes": hashes, "session": session, "turn": turn})
    return df.sort_values("arrival_s", kind="stable", ignore_index=True)
