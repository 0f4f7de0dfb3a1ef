"""Fit the simulator's cost parameters to measured runs and report its error."""
