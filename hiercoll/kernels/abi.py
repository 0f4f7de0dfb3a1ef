"""The row table's layout: the one contract between the table encoder and the Triton kernel.

Pure constants (no torch, no triton), so the encoder, the CPU emulator and the kernel all import
the same numbers and a change to the layout cannot reach only one of them.

A table is int64 words: `ROW_WORDS` words per row (fields `F_*`), then the variable-length
lists the rows point into (sources, waits of `WAIT_WORDS` words each, signals).
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_WORDS = 12
(F_COUNT, F_DST, F_REDUCE, F_ACC, F_SCALE, F_NSRC, F_SRC, F_NWAIT, F_WAIT, F_NSIG, F_SIG,
 F_ID) = range(ROW_WORDS)
WAIT_WORDS = 2          # (slot, per_epoch)
STEP_ELEMENTS = 4096    # elements one CTA moves per step of a row (the kernel's BLOCK)
ERR_WORDS = 8           # [flag, row, wait index, observed, needed, ...]


@dataclass(frozen=True)
class RowSpan:
    """One launch's rows: [first_row, first_row + num_rows) of the table, on `grid` CTAs;
    `aligned` rows take the vectorised path (every region 16-byte aligned)."""

    first_row: int
    num_rows: int
    grid: int
    aligned: bool
