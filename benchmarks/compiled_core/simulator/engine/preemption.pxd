# Cython prototype (docs/compiled-core.md): Preemption, the first base of
# ContinuousBatcher, becomes the extension type that holds the batch stream's typed state
# (an extension type may have one base with a C layout, so every field the mixins touch
# is declared here, on the first base).
cimport cython
from simulator.engine.kvcache cimport KVCache
from simulator.engine.request cimport Request

cdef class Preemption:
    cdef public KVCache kv
    cdef public long bs, max_seqs, max_tokens
    cdef public object waiting, swapped, arrived
    cdef public list prefilling
    cdef public dict decoding
    cdef public long k, sum_kv
    cdef public list residue, finishes, _groups
    cdef public long admitted, preemptions
    cdef public bint swap
    cdef public long cpu_free, pending_tokens, prefilled_tokens
    cdef public object gaps, prefix
    cdef public long _swap_io
    cdef public double admit_by
    cdef dict __dict__

    @cython.locals(kv=cython.long, blocks=cython.long)
    cpdef _preempt(self, Request req, double now)
    @cython.locals(req=Request)
    cpdef _swap_in(self)
