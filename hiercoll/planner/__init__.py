"""Planner: algorithm generators that turn a collective into a schedule."""

from hiercoll.planner.registry import algorithms, applicable, get_algorithm, plan, register

__all__ = ["algorithms", "applicable", "get_algorithm", "plan", "register"]
