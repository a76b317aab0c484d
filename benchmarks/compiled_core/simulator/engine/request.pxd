# Cython prototype (docs/compiled-core.md): compiles request.py's Request as an extension
# type with typed C fields. Read only by `cythonize`; the pure-Python module is unchanged.
# Integers are C long (a Python int beyond 2**63 raises OverflowError), times C double.

cdef class Request:
    cdef public long id
    cdef public double arrival_s
    cdef public long prompt, output, replica, state, target, computed, blocks, generated
    cdef public long k0, kv0, epoch, admit_seq
    cdef public double first_scheduled_s, first_token_s, finish_s
    cdef public long preemptions
    cdef public object status
    cdef public long client
    cdef public double last_token_s
    cdef public long retries
    cdef public object reason, hashes, session
    cdef public list units
    cdef public long shared, next_unit, cached_tokens, spec_steps, spec_accepted
    cdef public object requeued
    cdef public double queued_s
