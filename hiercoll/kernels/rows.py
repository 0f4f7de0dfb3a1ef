"""What the row-walking kernels (the simple one, `program.py`, and the LL one, `ll.py`) read the
same way: the row table's fields (and the error/trace record's sizes) as Triton constants, and
how two partial results combine.

Why a module of its own: each kernel's module would otherwise import the other's (the simple
kernel's launcher dispatches to the LL kernel)."""

from __future__ import annotations

import triton
import triton.language as tl

from hiercoll.kernels import abi as _t

# Triton reads module globals only when they are constexpr.
F_COUNT = tl.constexpr(_t.F_COUNT)
F_DST = tl.constexpr(_t.F_DST)
F_REDUCE = tl.constexpr(_t.F_REDUCE)
F_ACC = tl.constexpr(_t.F_ACC)
F_SCALE = tl.constexpr(_t.F_SCALE)
F_NSRC = tl.constexpr(_t.F_NSRC)
F_SRC = tl.constexpr(_t.F_SRC)
ROW_WORDS = tl.constexpr(_t.ROW_WORDS)
F_NWAIT = tl.constexpr(_t.F_NWAIT)
F_WAIT = tl.constexpr(_t.F_WAIT)
F_NSIG = tl.constexpr(_t.F_NSIG)
F_SIG = tl.constexpr(_t.F_SIG)
F_RELAXED = tl.constexpr(_t.F_RELAXED)
F_CTAS = tl.constexpr(_t.F_CTAS)
F_NALSO = tl.constexpr(_t.F_NALSO)
F_ALSO = tl.constexpr(_t.F_ALSO)
CTA_SHIFT = tl.constexpr(_t.CTA_SHIFT)
CTA_MASK = tl.constexpr((1 << _t.CTA_SHIFT) - 1)
WAIT_WORDS = tl.constexpr(_t.WAIT_WORDS)
ERR_WORDS = tl.constexpr(_t.ERR_WORDS)
TRACE_CALLS = tl.constexpr(_t.TRACE_CALLS)
TRACE_ROWS = tl.constexpr(_t.TRACE_ROWS)
TRACE_STRIDE = tl.constexpr(_t.TRACE_STRIDE)


@triton.jit
def combine(acc, y, REDUCE: tl.constexpr):
    """Two partial results under the reduce op (program.REDUCE_CODES: 0 sum, 1 max, 2 min)."""
    if REDUCE == 1:
        return tl.maximum(acc, y)
    elif REDUCE == 2:
        return tl.minimum(acc, y)
    else:
        return acc + y
