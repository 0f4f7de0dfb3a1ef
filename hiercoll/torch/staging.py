"""What a call pays to run a plan through the communicator's pool, and when the library's own
call on the caller's tensors is then the faster choice.

Why: the auto-picker ranks plans by times measured on their own symmetric buffers (zero-copy),
and NCCL by its call on the caller's tensors. Through the communicator, a plan that peers read
from or write into (the simple lowering) must copy the caller's input into the pool and the
result back out; an LL plan does not (ll_protocol.py: no peer touches its input or output).
A measured pick of a simple plan that wins by less than its copies loses through the
communicator.
"""

from __future__ import annotations

# Two copies (in, out) on 2 x H200, graph mode, `bench/comm_overhead.py` (the communicator's call
# minus its plan alone, bench/results/gpu/ll-w2/zero-copy/comm/): 3.31 us at 1 MiB and 14.85 us
# at 16 MiB, a launch-bound part and a bandwidth part, fitted through both points.
STAGING_FIXED_US = 2.54
STAGING_US_PER_MIB = 0.77


def staging_us(nbytes: int) -> float:
    """The copy in and out of `nbytes` each (the call's input and output of one rank)."""
    return STAGING_FIXED_US + STAGING_US_PER_MIB * nbytes / (1 << 20)


def library_beats_staged(plan_us: float | None, library_us: float | None, nbytes: int,
                         zero_copy: bool) -> bool:
    """The library's call is faster than the plan plus the copies the communicator adds to it
    (a plan that runs on the caller's tensors adds none). Unknown times decide nothing."""
    if zero_copy or plan_us is None or library_us is None:
        return False
    return library_us < plan_us + staging_us(nbytes)
