"""Choosing a plan: candidates, bound pruning, simulated ranking, library tables, selection."""
