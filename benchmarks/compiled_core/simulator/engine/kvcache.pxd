# Cython prototype (docs/compiled-core.md): KVCache as an extension type with C-long block
# counters; allocate/release callable from typed compiled callers without a Python call.

cpdef long blocks_for(long tokens, long block_size)

cdef class KVCache:
    cdef public long capacity, block_size, used, peak, cached, evictable
    cdef public object prefix
    cpdef allocate(self, long blocks)
    cpdef release(self, long blocks)
