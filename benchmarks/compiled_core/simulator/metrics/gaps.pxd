# Cython prototype (docs/compiled-core.md): GapHistogram as an extension type with typed
# counters and cpdef add/add_run (called once per decode step or run by the engine).
cimport cython

cdef class GapHistogram:
    cdef public object _times, _lens, _weights, _gaps, _counts, edges, counts
    cdef public long _pending
    cdef public object _total
    cdef public double sum_s, _scale, _log_lo

    cpdef add(self, double gap, long count=*)
    cpdef add_run(self, object times, long count)
