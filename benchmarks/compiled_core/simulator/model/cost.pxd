# Cython prototype (docs/compiled-core.md): StageCost as an extension type whose step
# coefficients are C doubles, so step() and decode_run() do their arithmetic in C (the same
# IEEE operations in the same order as the Python source: bit-identical results). Fields not
# declared here live in the instance __dict__.
cimport cython

@cython.locals(top=cython.double)
cpdef double _pnorm(double p, double a, double b, double c) except? -1.0

cdef class StageCost:
    cdef dict __dict__
    cdef public long layers
    cdef public bint first, last, graph_mixed
    cdef public double elem_bw, elem_launch, hidden_bytes, _launch, _cpu
    cdef public tuple graph_sizes
    cdef public dict _head, _fixed
    cdef public double _pfloor, _pseq, _ptok, _ppair, _pwaste, _pserial, _pqo, _pkv, _pp
    cdef public double _dfloor, _dseq, _dflop, _dkv, _dtok, _dexp

    @cython.locals(per=cython.double, serial=cython.double, compute=cython.double,
                   memory=cython.double)
    cpdef double prefill_attention(self, long tokens, double pairs, double ctx,
                                   long seqs) except? -1.0
    @cython.locals(per=cython.double)
    cpdef double _decode(self, long seqs, double stream) except? -1.0
    @cython.locals(padded=cython.long, launch=cython.double, attn=cython.double,
                   compute=cython.double, comm=cython.double, c=cython.double,
                   g=cython.double)
    cpdef tuple step(self, long tokens, double prefill_pairs, double prefill_ctx,
                     double decode_kv, long sampled, long seqs=*)
    @cython.locals(padded=cython.long, launch=cython.double, fixed0=cython.double,
                   comm=cython.double, head=cython.double, g=cython.double,
                   dkv=cython.double, dflop=cython.double, dfloor=cython.double,
                   dexp=cython.double, layers=cython.long, tok=cython.double,
                   per=cython.double, floor=cython.double, out=list,
                   with_head=cython.bint, kv=cython.long, stream=cython.double,
                   f=cython.double, attn=cython.double, compute=cython.double,
                   _=cython.long)
    cpdef tuple decode_run(self, long n, long decode_kv, long k)
