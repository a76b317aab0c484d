"""Build a cluster from a scenario, route requests to replicas, run the simulation."""
