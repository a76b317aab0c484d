"""GPU and node specifications, loaded from the data files in ``topologies/``."""
