# Cython prototype (docs/compiled-core.md): InlineSteps, the first base of Replica, becomes
# the extension type that holds the replica's typed state (one base with a C layout: every
# field that Replica and its other mixins touch is declared here; the rest, such as
# DecodeRunPath._step_s, lives in the instance __dict__).
cdef class InlineSteps:
    cdef dict __dict__
    cdef public object env, streams, stages, sends, on_finish, record_step, record_bulk
    cdef public object record_run, _idle, _running, _run_len, _runs, next_arrival, pull
    cdef public object _started, inboxes, procs, failed_at, stage_busy_s
    cdef public long index, outstanding, steps, step_tokens, generation, _active
    cdef public double overhead, swap_s, token_delay, union_s, _active_since
    cdef public bint _one_stage, fast, lag, run_ahead, up
    # object, not StageCost: tests pass duck-typed cost stubs (ConstCost, KVCost), which a
    # typed field rejects (TypeError: Cannot convert ConstCost to StageCost).
    cdef public object _stage0
