"""The row table's layout: the one contract between the table encoder and the Triton kernel.

Constants (no torch, no triton), so the encoder, the CPU emulator and the kernel all import the
same numbers and a change to the layout cannot reach only one of them. Two launch-shape numbers
can be overridden from the environment for sweeps (`sweep_knob`; every rank must see the same).

A table is int64 words: `ROW_WORDS` words per row (fields `F_*`), then the variable-length
lists the rows point into (sources, waits of `WAIT_WORDS` words each, signals, more
destinations).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def sweep_knob(name: str, default: int) -> int:
    """A launch-shape constant, overridable from the environment only so that
    bench/gpu/grid_sweep.sh can time other shapes in fresh processes (read once, at import)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"{name}={raw!r}: a positive integer (or unset for {default})")
    return int(raw)


ROW_WORDS = 17
(F_COUNT, F_DST, F_REDUCE, F_ACC, F_SCALE, F_NSRC, F_SRC, F_NWAIT, F_WAIT, F_NSIG, F_SIG,
 F_RELAXED, F_ID, F_LL, F_CTAS, F_NALSO, F_ALSO) = range(ROW_WORDS)
# F_NALSO / F_ALSO (simple kernel): more destinations that get the row's result as it is stored
# (`lowering.Row.also`: copies of the result merged into the row), a list like the sources
# F_CTAS (simple kernel): the CTAs that run the row, lo | hi << CTA_SHIFT (hi = 0: every CTA of
# the launch). Rows of one dependency level split the grid so they run side by side (lowering
# `_cta_ranges`); a CTA outside a row's range skips it (no wait, no data, no signal).
CTA_SHIFT = 16
# F_LL (LL programs, ll_protocol.py): bit 0, the destination is in the LL area; bit 1 + s,
# source s is. An LL address is an int32 offset from this rank's signal allocation (parity 0;
# parity 1 adds the program's `ll_half`), a plain one an element offset from its data. In an LL
# program a plain address of the rank's own input or output carries a tag (bits TAG_SHIFT up) and
# counts from that buffer's start: the kernel adds the call's base of it, so a call can read the
# caller's input and write the caller's output in place of the symmetric buffers (no peer ever
# touches either in an LL program).

TAG_SHIFT = 60
TAG_INPUT, TAG_OUTPUT = 1, 2
WAIT_WORDS = 2          # (slot, per_epoch | wide << WAIT_WIDE_SHIFT)
# a wide wait's slot is the low word of an NVSHMEM 64-bit signal: the kernel reads the whole word
WAIT_WIDE_SHIFT = 32
STEP_ELEMENTS = sweep_knob("HIERCOLL_STEP_ELEMENTS", 4096)   # elements one CTA moves per step
#                                                               of a row (the kernel's BLOCK)
LL_STEP_WORDS = 512     # LL kernel: 4-byte data words one CTA moves per step (x 8 sources polled)
ERR_WORDS = 8           # [flag, row, wait index, observed, needed, ...]
# Trace mode (HIERCOLL_KERNEL_TRACE=1): after the error record, CTA 0 of each launch writes
# %globaltimer stamps, one record of TRACE_STRIDE words per call (epoch % TRACE_CALLS): [0] the
# kernel's start, [1 + 4 i + k] row i's header loaded / waits satisfied / data moved / signals
# issued (k = 0..3, rows i < TRACE_ROWS), [TRACE_STRIDE - 1] its end.
TRACE_CALLS = 16
TRACE_ROWS = 15
TRACE_STRIDE = 2 + 4 * TRACE_ROWS
TRACE_WORDS = TRACE_CALLS * TRACE_STRIDE


@dataclass(frozen=True)
class RowSpan:
    """One launch's rows: [first_row, first_row + num_rows) of the table, on `grid` CTAs;
    `aligned` rows take the vectorised path (every region 16-byte aligned)."""

    first_row: int
    num_rows: int
    grid: int
    aligned: bool
    # some row stores more destinations (F_NALSO): the kernel's ALSO variant; launches without
    # run a binary with none of that code (a loop in the step loop, even of zero trips, made
    # 1 GiB rows 4 % slower on 2 x H200: results/gpu/mid-w2/ab-1)
    also: bool = False
