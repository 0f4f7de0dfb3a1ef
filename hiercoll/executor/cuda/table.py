"""Encode a RankProgram's kernel rows into the flat int64 table the Triton kernel walks.

Pure Python (tested on CPU). Addresses become element offsets relative to this rank's own
allocation base (`data_delta[r]` = (base of rank r - my base) / itemsize), so the kernel adds them
to a 16-byte-aligned pointer argument and Triton can vectorise aligned rows.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from hiercoll.executor.cuda.lowering import Addr, KernelLaunch, RankProgram, Row
from hiercoll.kernels import abi
from hiercoll.kernels.abi import RowSpan
from hiercoll.schedule import INPUT, OUTPUT


@dataclass(frozen=True)
class Table:
    words: list[int]                       # int64 words: rows first, then srcs/waits/signals
    launches: dict[int, RowSpan]           # id(KernelLaunch) -> where its rows are
    row_names: list[str]                   # debug: op id of each row
    wait_producers: list[str]              # debug: producer of each wait entry


def float_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


@dataclass(frozen=True)
class Moved:
    """A region of the layout (the plan's input or output: `size` elements at `start`) that
    lives elsewhere: on rank r its first element is `delta[r]` elements from this rank's data
    base (a caller's tensor in another symmetric allocation, the same offset on every rank)."""

    start: int
    size: int
    delta: tuple[int, ...]


def encode(program: RankProgram, data_delta: list[int], sig_delta: list[int],
           moved: tuple[Moved, ...] = ()) -> Table:
    """`moved`: regions whose addresses go to the caller's tensors (backend.rebased); not for
    LL programs, whose own input and output are tagged instead."""
    assert not (moved and program.ll_half), "LL programs read the caller's tensors by tag"
    launches: list[KernelLaunch] = []
    if program.start_barrier is not None:
        launches.append(program.start_barrier)
    for items in [*program.streams.values(), program.net]:
        launches.extend(x for x in items if isinstance(x, KernelLaunch))
    launches.append(program.end_barrier)
    rows: list[Row] = [r for launch in launches for r in launch.rows]
    words = [0] * (len(rows) * abi.ROW_WORDS)
    extra: list[int] = []
    base = len(words)
    producers: list[str] = []

    lay = program.layout
    own = (((lay.offsets[INPUT], lay.sizes.get(INPUT, 0), abi.TAG_INPUT),
            (lay.offsets[OUTPUT], lay.sizes.get(OUTPUT, 0), abi.TAG_OUTPUT))
           if program.ll_half else ())     # only LL programs tag (abi.TAG_*)

    def rel(a: Addr, ll: bool = False) -> int:
        if ll:   # a word of the LL area: two int32 slots of the signal allocation
            return sig_delta[a.rank] + 2 * (a.offset // program.ll_epw)
        if a.rank == program.rank:      # an LL program's own input/output: tagged (abi.py)
            for start, size, tag in own:
                if start <= a.offset < start + size:
                    return (tag << abi.TAG_SHIFT) | (a.offset - start)
        for m in moved:
            if m.start <= a.offset < m.start + m.size:
                return m.delta[a.rank] + a.offset - m.start
        return data_delta[a.rank] + a.offset

    for i, row in enumerate(rows):
        w = i * abi.ROW_WORDS
        words[w + abi.F_COUNT] = row.count
        words[w + abi.F_DST] = rel(row.dst, bool(row.ll & 1)) if row.dst else 0
        words[w + abi.F_REDUCE] = int(row.reduce)
        words[w + abi.F_ACC] = int(row.accumulate)
        words[w + abi.F_SCALE] = float_bits(row.scale)
        words[w + abi.F_NSRC], words[w + abi.F_SRC] = len(row.srcs), base + len(extra)
        extra.extend(rel(s, bool(row.ll >> (1 + k) & 1)) for k, s in enumerate(row.srcs))
        words[w + abi.F_LL] = row.ll
        words[w + abi.F_NWAIT], words[w + abi.F_WAIT] = len(row.waits), base + len(extra)
        for wt in row.waits:
            extra.extend((sig_delta[program.rank] + wt.slot, wt.word))
            producers.append(wt.producer)
        words[w + abi.F_NSIG], words[w + abi.F_SIG] = len(row.signals), base + len(extra)
        extra.extend(sig_delta[s.rank] + s.slot for s in row.signals)
        words[w + abi.F_RELAXED] = int(row.relaxed)
        words[w + abi.F_ID] = i
        words[w + abi.F_CTAS] = row.ctas[0] | row.ctas[1] << abi.CTA_SHIFT if row.ctas else 0
        words[w + abi.F_NALSO], words[w + abi.F_ALSO] = len(row.also), base + len(extra)
        extra.extend(rel(a) for a in row.also)
    placed: dict[int, RowSpan] = {}
    first = 0
    for launch in launches:
        placed[id(launch)] = RowSpan(first, len(launch.rows), launch.grid, launch.aligned,
                                     any(r.also for r in launch.rows))
        first += len(launch.rows)
    return Table(words + extra, placed, [r.op for r in rows], producers)

