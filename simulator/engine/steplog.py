"""The step log of a replica: the aggregates of the steps it ran (steps, tokens, busy time
per stage, the busy union) and the one sink of its step records.

A step record is one row of ``steps.csv``: the fields of :data:`STEP_COLUMNS`, in that
order, for one stage of one step. Every path of the replica (a step run inline, a stage of
a pipelined replica, a decode run advanced in one event) hands its records to
:class:`StepLog` in the form it built them: a tuple per stage step (:meth:`StepLog.row`), a
short decode run of a one-stage replica in compact form (:meth:`StepLog.run`, expanded by
:func:`simulator.metrics.records.run_columns`), or a long run's columns keyed by
:data:`STEP_COLUMNS` (:meth:`StepLog.columns`). The recorder behind them is the run's
(:class:`simulator.metrics.records.Recorder`); without per-step records ``row`` is None and
the paths skip building them, while the aggregates are kept either way.
"""

from __future__ import annotations

from collections.abc import Callable

#: The fields of a step record, in order (``steps.csv``'s columns).
STEP_COLUMNS = ["replica", "stage", "stream", "start_s", "end_s", "prefill_tokens",
                "decode_tokens", "batch_size", "compute_s", "comm_s", "kv_blocks",
                "prefill_pairs", "prefill_ctx", "decode_kv", "sampled"]


class StepLog:
    """Aggregates and record sink of one replica's steps (see the module docstring).

    Parameters
    ----------
    stages : int
        Pipeline stages of the replica.
    row : callable(tuple) or None
        Takes one stage step's record; None keeps no per-step records.
    run : callable(tuple) or None
        Takes a short decode run's records in compact form; None (or no ``row``): they come
        as rows.
    columns : callable(dict) or None
        Takes a long decode run's records as columns.

    Attributes
    ----------
    steps, step_tokens : int
        Micro-batches run and their tokens (for batching efficiency).
    stage_busy_s : list of float
        Time each stage computed or communicated.
    union_s : float
        Time during which at least one stage was busy (for bubbles).
    """

    __slots__ = ("steps", "step_tokens", "stage_busy_s", "union_s", "row", "run", "columns")

    def __init__(self, stages: int, row: Callable[[tuple], None] | None = None,
                 run: Callable[[tuple], None] | None = None,
                 columns: Callable[[dict], None] | None = None):
        self.steps = self.step_tokens = 0
        self.stage_busy_s = [0.0] * stages
        self.union_s = 0.0
        self.row, self.columns = row, columns
        self.run = run if row is not None else None

    def rows(self, rows) -> None:
        """Hand ``rows`` (step records) to the sink, in order."""
        row = self.row
        for r in rows:
            row(r)

    def count(self, steps: int, tokens: int, busy) -> None:
        """Aggregates of steps that ran with nothing overlapping (their stage spans never
        overlap, so the busy union is the sum); ``busy`` is a float for one stage, else a
        sequence per stage."""
        self.steps += steps
        self.step_tokens += tokens
        if len(self.stage_busy_s) == 1:
            b = float(busy)
            self.stage_busy_s[0] += b
            self.union_s += b
        else:
            for i, b in enumerate(busy):
                self.stage_busy_s[i] += float(b)
                self.union_s += float(b)

    def compact(self, run: tuple | None, lead: bool, steps: int) -> None:
        """Records of a short run kept in compact form: the scheduled step if it came
        first (``lead``) and the first ``steps`` extra steps."""
        m = lead + steps
        if run is not None and m:
            index, ends, off, n, computes, comm, used, needs, kv = run
            self.run((index, ends[: m + 1], off, n, computes[:m], comm, used, needs[:m], kv))

    def keep(self, rows: list[tuple], bulk: dict | None, steps: int) -> None:
        """Records of the first ``steps`` extra steps of a run (rows or columns)."""
        n = steps * len(self.stage_busy_s)
        if bulk is not None:
            self.columns({k: v[:n] for k, v in bulk.items()})
        elif rows:
            self.rows(rows[:n])
