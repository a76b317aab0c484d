"""One replica: continuous batching over a paged KV cache, pipeline stages as SimPy processes."""
