"""Every row of a fit predicted under one set of costs, the rows spread over worker processes.

The solver asks for every training row's prediction at each of its steps (hundreds of steps,
times the folds of a cross-validation): one process spent over ten minutes on the 384 graph rows
of one 4-GPU bench, longer than a device call lasts, while the GPU host's CPUs sat idle. Rows are
independent given the costs, so forked workers predict interleaved shares of them and the
results come back in row order: the same floats one process computes, whatever `jobs` is.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from types import TracebackType

from hiercoll.calibration.predict import Case, predict_us
from hiercoll.topology import Topology

MIN_ROWS_PER_JOB = 16       # below this a worker's share costs less than sending it
MAX_DEFAULT_JOBS = 16

# the rows and base of the pool being forked: workers inherit them (nothing is pickled but the
# costs of each request and the floats that come back)
_ROWS: Sequence[Case] = ()
_BASE: Topology | None = None


def default_jobs() -> int:
    """The CPUs this process may use, at most MAX_DEFAULT_JOBS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_JOBS))


def _predict_share(request: tuple[int, int, Topology]) -> list[float]:
    start, stride, timed_on = request
    assert _BASE is not None
    return [predict_us(c, timed_on, _BASE) for c in _ROWS[start::stride]]


class RowPredictor:
    """`predictor(costs)`: every row's simulated time under `costs`, in row order."""

    def __init__(self, rows: Sequence[Case], base: Topology, jobs: int = 1) -> None:
        self.rows, self.base = list(rows), base
        self.jobs = max(1, min(jobs, len(self.rows) // MIN_ROWS_PER_JOB))
        self._pool: multiprocessing.pool.Pool | None = None
        if self.jobs > 1:
            global _ROWS, _BASE
            _ROWS, _BASE = self.rows, base
            self._pool = multiprocessing.get_context("fork").Pool(self.jobs)

    def __call__(self, timed_on: Topology) -> list[float]:
        if self._pool is None:
            return [predict_us(c, timed_on, self.base) for c in self.rows]
        k = self.jobs
        shares = self._pool.map(_predict_share, [(j, k, timed_on) for j in range(k)])
        out = [0.0] * len(self.rows)
        for j, share in enumerate(shares):
            out[j::k] = share
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> RowPredictor:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
