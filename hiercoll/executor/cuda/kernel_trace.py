"""In-kernel timer stamps of the row kernel (`HIERCOLL_KERNEL_TRACE=1`): where a call's time
goes inside its one launch, on the real multi-GPU machine, where `ncu` cannot replay a kernel
that waits on its peers.

CTA 0 of each launch stores %globaltimer at its start, after each row's header, waits, data and
signals, and at its end (`kernels.abi.TRACE_*`, one record per call, the last TRACE_CALLS calls
kept). Stamps are read after the point they time has produced a value, so they bound it from
above; the tracing itself adds a CTA barrier and a store per point.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hiercoll.kernels.abi import ERR_WORDS, TRACE_CALLS, TRACE_ROWS, TRACE_STRIDE, TRACE_WORDS

if TYPE_CHECKING:
    import torch

ENV = "HIERCOLL_KERNEL_TRACE"
PHASES = ("header", "waits", "data", "signals")


def trace_enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def err_words(trace: bool) -> int:
    """Size of the kernel's error record: the trace stamps follow it in trace mode."""
    return ERR_WORDS + (TRACE_WORDS if trace else 0)


@dataclass(frozen=True)
class CallTrace:
    """One call on one rank, ns on that GPU's timer: `rows[i][k]` is phase k of row i, relative
    to the kernel's start (rows the launch did not reach are absent)."""

    start_ns: int
    end_ns: int
    rows: tuple[tuple[int, int, int, int], ...]

    @property
    def kernel_ns(self) -> int:
        return self.end_ns - self.start_ns


def read_traces(err: torch.Tensor, num_rows: int) -> list[CallTrace]:
    """The recorded calls in start order (synchronises: call after the work)."""
    words = err[ERR_WORDS:ERR_WORDS + TRACE_WORDS].tolist()
    calls = []
    for c in range(TRACE_CALLS):
        rec = words[c * TRACE_STRIDE:(c + 1) * TRACE_STRIDE]
        start, end = rec[0], rec[-1]
        if start <= 0 or end < start:
            continue
        rows = tuple(tuple(rec[1 + 4 * i + k] - start for k in range(4))
                     for i in range(min(num_rows, TRACE_ROWS)))
        calls.append(CallTrace(start, end, rows))
    return sorted(calls, key=lambda t: t.start_ns)
