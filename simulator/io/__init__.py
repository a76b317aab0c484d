"""Scenario loading and validation; result writers."""
