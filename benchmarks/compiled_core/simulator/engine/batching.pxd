# Cython prototype (docs/compiled-core.md): ContinuousBatcher's hot methods as cpdef with
# typed locals; its state is declared on its first base (preemption.pxd).
cimport cython
from simulator.engine.kvcache cimport KVCache
from simulator.engine.preemption cimport Preemption
from simulator.engine.request cimport Request

cdef class Batch:
    cdef public long tokens, prefill_tokens, prefill_ctx, n_decode, decode_kv, sampled
    cdef public long batch_size, kv_blocks, swap_blocks, spec
    cdef public double prefill_pairs, draft_s
    cdef public list chunks

cdef class ContinuousBatcher(Preemption):
    cpdef add(self, Request req)
    cpdef long _decode_need(self, long step) except? -1
    cpdef long _admit_blocks(self, Request req, long tokens) except? -1
    cpdef long _chunk_blocks(self, Request req, long tokens) except? -1
    cpdef long _held_blocks(self, Request req, long kv_tokens) except? -1
    cpdef _start_decode(self, Request req, long kv_tokens, double last_token_s)
    @cython.locals(kv=cython.long)
    cpdef long _stop_decode(self, Request req) except? -1
    cpdef _join(self, double time, long count)
    cpdef _emit(self, double now)
    cpdef long _schedule_decodes(self, double now) except? -1
    @cython.locals(kv=KVCache, bs=cython.long, i=cython.long, req=Request, c=cython.long,
                   x=cython.long, extra=cython.long)
    cpdef long _continue_prefills(self, long budget, list chunks, double now) except? -1
    @cython.locals(kv=KVCache, req=Request, c=cython.long, x=cython.long,
                   blocks=cython.long)
    cpdef long _admit(self, long budget, list chunks, double now, bint chunked=*,
                      object limit=*) except? -1
    @cython.locals(req=Request, x=cython.long, c=cython.long, prefill_tokens=cython.long,
                   pairs=cython.double, ctx=cython.long, sampled=cython.long)
    cpdef _batch(self, long n_decode, list chunks)
    @cython.locals(kv=KVCache, need=cython.long, n=cython.long)
    cpdef schedule(self, double now)
    @cython.locals(k=cython.long, req=Request, kv=cython.long, done=list, fin=list)
    cpdef complete(self, Batch batch, double now)
    @cython.locals(req=Request, x=cython.long)
    cpdef _complete_chunks(self, Batch batch, double now, list done)
