# Cython prototype (docs/compiled-core.md): Replica as an extension type (its state is
# declared on its first base, stepping.pxd). serve() stays a generator (a def method: its
# locals cannot be typed from a .pxd, only self is).
from simulator.engine.stepping cimport InlineSteps

cdef class Replica(InlineSteps):
    pass
