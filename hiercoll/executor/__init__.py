"""Executors: the numpy reference here; GPU and gloo backends are optional extras."""

from hiercoll.executor.backends import get_backend
from hiercoll.executor.interface import Backend, BackendName, Mode, Prepared, RunResult, check_launch
from hiercoll.executor.reference import VerifyReport, execute, verify

__all__ = ["Backend", "BackendName", "Mode", "Prepared", "RunResult", "VerifyReport",
           "check_launch", "execute", "get_backend", "verify"]
