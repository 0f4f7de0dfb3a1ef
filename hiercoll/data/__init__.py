"""Data shipped with hiercoll: measured library tables (see planner/search/library.py)."""
