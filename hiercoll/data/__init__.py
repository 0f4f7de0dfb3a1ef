"""Data shipped with hiercoll: measured library tables (see planner/library.py)."""
