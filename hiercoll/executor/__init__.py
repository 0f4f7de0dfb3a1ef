"""Executors: the numpy reference here; GPU and gloo backends are optional extras."""

from hiercoll.executor.reference import VerifyReport, execute, verify

__all__ = ["VerifyReport", "execute", "verify"]
