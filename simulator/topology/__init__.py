"""The cluster as a networkx graph, and path queries over it."""
