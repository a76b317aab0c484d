"""Arrival processes, length samplers and trace replay."""
