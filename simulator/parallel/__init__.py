"""Parallel layouts (TP x PP x DP) placed on GPUs, and collective times over the graph."""
