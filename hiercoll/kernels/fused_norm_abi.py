"""The fused all-reduce + residual add + RMSNorm protocol's layout: who owns which rows, which
signal slot a CTA writes, where the staged tensors live in a rank's symmetric buffer.

Pure Python (no torch, no triton): the Triton kernel (`kernels/fused_norm.py`), its host side
(`executor/cuda/fused_norm.py`) and the weak-memory emulator (`executor/cuda/fused_emulate.py`)
all use these functions, so the protocol they check is the one the kernel runs.

The protocol, per call, for CTA c (of G, the same G on every rank and every call) of rank r:
- epoch e = epoch[c] + 1 (a per-CTA device counter: no CTA waits for another CTA of its own
  rank, and graph replay needs no host counter); parity p = e % 2 picks the half of every
  double-buffered region; every signal written in the call carries the value e.
- 1-stage: stage this CTA's rows of x in my buffer X[p] -> CTA barrier -> release (system
  scope) e into slot (p, 0, c, r) of every peer -> acquire every peer's slot (p, 0, c, q) >= e
  (one polling thread, then every thread acquires on its own) -> sum the rows over ranks 0..W-1
  in fp32 (own x local, peers' X[p] remote) -> bf16 -> + residual -> RMSNorm -> outputs.
- 2-stage: rank q owns rows `owner_rows(M, W, q)`; CTA c stages the rows CTA c of every other
  rank will reduce -> release phase 0 -> acquire phase 0 -> reduce + add + norm of its own rows
  into the outputs, and the rounded sums of its rows into S[p] of my buffer -> release phase 1
  -> acquire phase 1 -> read every other rank's rows of this CTA from their S[p] (all-gather by
  pull) and do the residual add + RMSNorm of those rows here. Gathering the sum instead of both
  outputs halves the second phase's NVLink reads (the outputs are two tensors, the sum one);
  it is why `residual` must be replicated: every rank adds its own copy.
  The add + norm is one function of (sum, residual, weight) in the kernel, so the owner's rows
  and everyone else's have the same bits.
- LL (stage LL_STAGE, 16-bit types, even hidden, up to LL_MAX_ELEMENTS of x): 1-stage's rows
  as 32-bit data words (two elements), each stored with e in its high half as one 8-byte relaxed
  system-scope store into region (p, r) of every peer's LL area (`ll_word`); a reader loads its
  own words until each carries e (the load is the wait: the word checked is the data used, no
  release, acquire or fence), then sums, adds and normalises as 1-stage does. No signal slot and
  no barrier: the cheapest form for the small calls of TP decode (`kernels/ll.py`'s protocol).
  Double-buffering by p is enough for the reason below: a rank's call e kernel polled every
  peer's call-e words (some CTA has rows), which each peer stored only after its call e-1 kernel
  (the last reader of parity p before e+1) had finished, kernels on one stream running in order.
Why double buffers are enough: a rank writes X[p] (or S[p]) of call e only after its call
e-1 kernel finished, and that kernel waited for every peer's call e-1 signal, which each peer sent
after its call e-2 kernel (the last reader of the same half) had finished. (The 2-stage kernel
alone would be safe with one half: no rank ends a call before every peer has read its rows, its
phase-1 signal says so; the 1-stage kernel needs both, see the emulator's test.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ordering:
    """The kernel's three ordering switches (all on: the correct protocol). Off, they exist for
    the tests that prove the checks catch a missing release, acquire, or per-thread acquire;
    acquire=False removes every acquire (the poll and the per-thread ones)."""

    release: bool = True
    acquire: bool = True
    acquire_all_threads: bool = True


SAFE = Ordering()
PHASES = 2          # signal phases per call (1-stage uses phase 0 only)
ERR_WORDS = 8       # debug timeout record: [flag, cta, phase, peer, seen, needed, 0, 0]


def split(lo: int, n: int, parts: int, i: int) -> tuple[int, int]:
    """Part i of `parts` near-equal contiguous parts of [lo, lo + n) (the kernel's formula)."""
    return lo + n * i // parts, lo + n * (i + 1) // parts


def owner_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """2-stage: the rows `rank` reduces and normalises."""
    return split(0, rows, world, rank)


def cta_rows(rows: int, world: int, grid: int, stages: int, owner: int, cta: int) -> tuple[int, int]:
    """The rows CTA `cta` of the owner `owner` reduces (1-stage: every rank reduces all rows, and
    `owner` is ignored)."""
    if stages == 1:
        return split(0, rows, grid, cta)
    lo, hi = owner_rows(rows, world, owner)
    return split(lo, hi - lo, grid, cta)


def slot(parity: int, phase: int, cta: int, src: int, grid: int, world: int) -> int:
    """Index (int32 words) of the slot in which rank `src`'s CTA `cta` signals, in the receiver's
    signal array."""
    return ((parity * PHASES + phase) * grid + cta) * world + src


def num_slots(grid: int, world: int) -> int:
    return 2 * PHASES * grid * world


REGIONS = 4         # X[2], S[2]
LL_STAGE = 3        # the LL form of 1-stage (`stage=3`)
LL_MAX_ELEMENTS = 1 << 17   # the largest x (elements) the LL form takes
LL_WORDS = LL_MAX_ELEMENTS // 2     # 8-byte words of one (parity, source) region
# No padding between rows in the LL area: 32 words a row were tried on 4 x H200 (one run, both
# ways, e6db7cc, bench/results/gpu/fused_norm_multi/ll-w4/pad-ab) and made every shape slower
# (M = 1..16 at hidden 4096: 9.3-11.2 us padded, 8.2-10.3 not).


def parts(stages: int) -> int:
    """Launch parts of a call (the interpreter runs each rank's part k before any rank's k+1):
    LL pushes, then polls; 1-stage stages, then reduces; 2-stage adds the gather."""
    return 2 if stages == LL_STAGE else stages + 1


def ll_area_words(world: int) -> int:
    """8-byte words of one rank's LL area: 2 parities x `world` sources x LL_WORDS."""
    return 2 * world * LL_WORDS


def ll_word(parity: int, src: int, row: int, col: int, hidden: int, world: int) -> int:
    """Index (8-byte words) in the receiver's LL area of the word holding elements `col` (even)
    and `col + 1` of row `row` of rank `src`'s x in a call of parity `parity`."""
    return (parity * world + src) * LL_WORDS + (row * hidden + col) // 2


def ll_max_rows(hidden: int) -> int:
    """The most rows of `hidden` elements the LL form takes (x within LL_MAX_ELEMENTS)."""
    return LL_MAX_ELEMENTS // max(hidden, 1)


def ll_applies(rows: int, hidden: int, itemsize: int) -> bool:
    """Whether the LL form can run a call: 16-bit elements (two to a word), whole words per row,
    and at most `ll_max_rows` rows."""
    return itemsize == 2 and hidden % 2 == 0 and rows <= ll_max_rows(hidden)


@dataclass(frozen=True)
class BufferLayout:
    """Element offsets of the staged regions in a rank's symmetric data buffer: X[2] (staged
    inputs), S[2] (2-stage: the rounded sums of the rows this rank owns), `stride` elements each
    (fixed for the buffer's life: a region of one call never overlaps another region of the next
    call, whatever their shapes; row `i` of a call with `hidden` columns starts at i * hidden)."""

    stride: int

    def x(self, parity: int) -> int:
        return parity * self.stride

    def sums(self, parity: int) -> int:
        return (2 + parity) * self.stride

    @property
    def numel(self) -> int:
        return REGIONS * self.stride


def cta_active(rows: int, world: int, grid: int, stages: int, cta: int) -> bool:
    """Whether CTA `cta` takes part in a call (the same answer on every rank): it has rows to
    reduce on some rank, or it is CTA 0. An idle CTA only advances its call counter. CTA 0
    always signals and waits, so every call still waits on every peer: the double-buffer
    argument above needs each call to prove that the peers finished the call before."""
    if cta == 0:
        return True
    owners = [0] if stages == 1 else range(world)
    return any(cta_rows(rows, world, grid, stages, q, cta)[1]
               > cta_rows(rows, world, grid, stages, q, cta)[0] for q in owners)
