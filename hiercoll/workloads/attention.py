"""MagiAttention-style context parallelism for any attention mask: from the mask to a balanced
dispatch of query chunks and a zero-redundancy K/V group-cast.

The steps, each a function with a typed result:
1. `chunk_areas`: the attention area (allowed (q, k) pairs) of each query chunk, per mask type.
2. `dispatch`: chunks to ranks, every rank the same number of chunks, balancing area (solvers
   are pluggable: `SOLVERS`).
3. `host_ranges` (the tokens a rank holds: Q, K and V of its chunks), `needed_ranges` (the keys
   its queries attend to), `remote_ranges` = needed minus hosted: a token is fetched once by
   every rank that needs it and does not host it (zero redundancy), `transfer_table`.
4. the group-cast that moves them (`KVCast`) and its transpose, the group-reduce of dK/dV; whole,
   or cut into `degree` stages so that one stage's transfer overlaps the previous one's compute.
`solve` runs them all and returns an `AttentionPlan`.

**Mask.** Triples (q_range, k_range, type) of half-open token intervals of one packed sequence.
For q = [qs, qe), k = [ks, ke), Lq = qe - qs, Lk = ke - ks, the query at qs + i (0 <= i < Lq)
attends to the key at ks + j (0 <= j < Lk) when
    full:        always
    causal:      j <= i + (Lk - Lq)          bottom-right aligned (flash-attention's causal)
    inv_causal:  j >= i                      top-left aligned inverse
    bi_causal:   i <= j <= i + (Lk - Lq)     both
In global positions the keys of query q are one interval [lo(q), hi(q)) (empty when hi <= lo):
    lo = ks (full, causal) or q - qs + ks (inv_causal, bi_causal)
    hi = ke (full, inv_causal) or q + 1 + ke - qe (causal, bi_causal)
Both ends are lines of slope 0 or 1 in q, which is what the exact area, needed-key and overlap
formulas below rest on. No (q, k) pair may lie in two triples (each pair is computed once, as
in MagiAttention's slices): `check_mask` refuses overlaps, naming a shared pair.

**Group-cast layout** (`KVCast.group_cast_splits`): rank r's input is its host tokens in
ascending order, one row (`row_elems` elements) per token; its output is its remote tokens in
ascending order. An input split is a run of consecutive input rows with one destination set; a
run nobody else needs stays in the input as a split with `peers=[]`. collectives.GroupSplits
accepts that: only a group_cast *output* split must name exactly one peer, an input split with
no peer sends nothing. So the input is the rank's K/V tensor as is, no packing of the rows to
send. An output split is a run of consecutive output rows from one source rank. In the
transposed group_reduce those no-peer input splits become output rows no source adds to: they
keep their values. No split has size 0.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from hiercoll.collectives import GroupSplits, RankSplits, Split, transpose
from hiercoll.errors import HiercollError
from hiercoll.topology.load import read_structured_file
from hiercoll.workloads.common import divide_evenly

Interval = tuple[int, int]                       # [start, stop) in global token positions
Ranges = tuple[Interval, ...]                    # sorted, disjoint, non-adjacent
RangesPerRank = tuple[Ranges, ...]


# ---- the mask ---------------------------------------------------------------------------------
class MaskType(StrEnum):
    FULL = "full"
    CAUSAL = "causal"
    INV_CAUSAL = "inv_causal"
    BI_CAUSAL = "bi_causal"


MASK_TYPES: tuple[MaskType, ...] = tuple(MaskType)
_TYPE_NAMES = ", ".join(t.value for t in MASK_TYPES)


class MaskSlice(NamedTuple):
    """One triple of the mask: queries `q` attend to keys `k` with pattern `type`."""

    q: Interval
    k: Interval
    type: MaskType


Mask = tuple[MaskSlice, ...]
MaskLike = Iterable[MaskSlice | Sequence[Any] | Mapping[str, Any]]


class MaskEntry(BaseModel):
    """One triple as a mask file holds it: `{q: [s, e], k: [s, e], type: causal}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    q: tuple[int, int] = Field(description="query tokens [start, end)")
    k: tuple[int, int] = Field(description="key tokens [start, end)")
    type: MaskType = Field(description=f"one of {_TYPE_NAMES}")

    @field_validator("type", mode="before")
    @classmethod
    def _known(cls, v: Any) -> Any:
        if isinstance(v, str) and v not in {t.value for t in MASK_TYPES}:
            raise ValueError(f"unknown mask type {v!r}; use one of {_TYPE_NAMES}")
        return v

    def as_slice(self) -> MaskSlice:
        return MaskSlice(self.q, self.k, MaskType(self.type))


_MASK_FILE = TypeAdapter(list[MaskEntry])


def _loc(loc: Sequence[int | str], head: str) -> str:
    """pydantic's error location as `head[2].q` (indices in brackets, fields after dots)."""
    out = head
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _one_line(err: ValidationError, head: str, source: str | None = None) -> HiercollError:
    """First pydantic error as one line: `[source: ]field: message`."""
    first = err.errors()[0]
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field; remove it or check the spelling"
    elif first["type"] == "missing":
        msg = "required field is missing"
    where = _loc(first["loc"], head)
    return HiercollError(f"{source}: {where}: {msg}" if source else f"{where}: {msg}")


def _entry(i: int, item: MaskSlice | Sequence[Any] | Mapping[str, Any]) -> MaskSlice:
    if isinstance(item, MaskSlice):
        data: Any = {"q": item.q, "k": item.k, "type": item.type}
    elif isinstance(item, Mapping):
        data = item
    elif isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 3:
        data = {"q": item[0], "k": item[1], "type": item[2]}
    else:
        raise HiercollError(f"mask[{i}]: {item!r} is not a (q_range, k_range, type) triple")
    try:
        return MaskEntry.model_validate(data).as_slice()
    except ValidationError as err:
        raise _one_line(err, f"mask[{i}]") from None


def as_mask(mask: MaskLike) -> Mask:
    """Triples from tuples `((qs, qe), (ks, ke), "causal")`, dicts or `MaskSlice`s; types checked."""
    return tuple(_entry(i, item) for i, item in enumerate(mask))


def load_mask(path: str | Path) -> Mask:
    """A mask file (YAML or JSON): a list of `{q: [s, e], k: [s, e], type: ...}`."""
    p = Path(path)
    data = read_structured_file(p)
    if not isinstance(data, list) or not data:
        raise HiercollError(f"{p}: expected a list of {{q: [start, end], k: [start, end], type: ...}}"
                            + (" (the file's list is empty)" if data == [] else ""))
    try:
        return tuple(e.as_slice() for e in _MASK_FILE.validate_python(data))
    except ValidationError as err:
        raise _one_line(err, "mask", str(p)) from None


def _check_range(i: int, field: str, iv: Interval, total: int) -> None:
    s, e = iv
    where = f"mask[{i}].{field}: [{s}, {e})"
    if s < 0:
        raise HiercollError(f"{where} starts before 0; keep ranges inside [0, {total})")
    if e > total:
        raise HiercollError(f"{where} ends past total_seqlen {total}; keep ranges inside [0, {total})")
    if e <= s:
        raise HiercollError(f"{where} is empty or reversed; give start < end or drop the triple")


def check_mask(mask: MaskLike, total_seqlen: int) -> Mask:
    """The mask, normalised; refuses out-of-bounds or empty ranges and overlapping triples."""
    _positive("total_seqlen", total_seqlen)
    m = as_mask(mask)
    for i, s in enumerate(m):
        _check_range(i, "q", s.q, total_seqlen)
        _check_range(i, "k", s.k, total_seqlen)
    _check_disjoint(m)
    return m


def _positive(name: str, v: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise HiercollError(f"{name}: {v!r} must be a positive integer")


# ---- one triple: key bounds as lines, areas, needed keys, overlaps ----------------------------
@dataclass(frozen=True, slots=True)
class _Line:
    """`a + slope * q`, slope 0 or 1: one end of a query's key interval."""

    a: int
    slope: int

    def at(self, q: int) -> int:
        return self.a + self.slope * q


def _bounds(s: MaskSlice) -> tuple[_Line, _Line]:
    """(lo, hi): query q of `s` attends to keys [lo(q), hi(q)) (see the module doc)."""
    (qs, qe), (ks, ke) = s.q, s.k
    lo = _Line(ks, 0) if s.type in (MaskType.FULL, MaskType.CAUSAL) else _Line(ks - qs, 1)
    hi = _Line(ke, 0) if s.type in (MaskType.FULL, MaskType.INV_CAUSAL) else _Line(1 + ke - qe, 1)
    return lo, hi


def _tri(n: int) -> int:
    """1 + 2 + ... + n (0 for n <= 0)."""
    return n * (n + 1) // 2 if n > 0 else 0


def slice_area(s: MaskSlice, rows: Interval) -> int:
    """Allowed (q, k) pairs of `s` whose query lies in `rows` (global positions): exact, O(1).

    Local rows i in [a, b) of s, d = Lk - Lq; row i has
      full: Lk keys; causal: max(0, i + 1 + d) (never above Lk since i < Lq);
      inv_causal: max(0, Lk - i); bi_causal: d + 1 if d >= 0 else 0."""
    qs, qe = s.q
    a, b = max(rows[0], qs) - qs, min(rows[1], qe) - qs
    if b <= a:
        return 0
    lk = s.k[1] - s.k[0]
    d = lk - (qe - qs)
    if s.type == MaskType.FULL:
        return (b - a) * lk
    if s.type == MaskType.CAUSAL:
        return _tri(b + d) - _tri(a + d)
    if s.type == MaskType.INV_CAUSAL:
        return _tri(lk - a) - _tri(lk - b)
    return (b - a) * max(0, d + 1)


def slice_keys(s: MaskSlice, rows: Interval) -> Interval | None:
    """The keys that the queries of `rows` attend to in `s`, as one interval (None: none).

    The width hi(q) - lo(q) is linear in q, so the rows with keys are one run [a, b); each row's
    interval starts at most one after the previous one starts and ends no earlier, and it is not
    empty, so the union is [lo(a), hi(b - 1))."""
    lo, hi = _bounds(s)
    a, b = max(rows[0], s.q[0]), min(rows[1], s.q[1])
    c0, c1 = hi.a - lo.a, hi.slope - lo.slope        # width(q) = c0 + c1 * q
    if c1 > 0:
        a = max(a, 1 - c0)
    elif c1 < 0:
        b = min(b, c0)
    elif c0 <= 0:
        return None
    return (lo.at(a), hi.at(b - 1)) if a < b else None


def _shared_pair(s: MaskSlice, t: MaskSlice) -> tuple[int, int] | None:
    """A (q, k) pair both triples allow, or None.

    For q in both q-ranges, min(hi_s, hi_t) - max(lo_s, lo_t) is concave and piecewise linear
    with integer kinks (where the two his or the two los cross), so its maximum over the integer
    rows is at an end or at a kink: checking those few rows is exact."""
    q0, q1 = max(s.q[0], t.q[0]), min(s.q[1], t.q[1])
    if q0 >= q1:
        return None
    (ls, hs), (lt, ht) = _bounds(s), _bounds(t)
    rows = {q0, q1 - 1}
    for x, y in ((ls, lt), (hs, ht)):
        if x.slope != y.slope:
            kink = (y.a - x.a) // (x.slope - y.slope)
            rows.add(min(max(kink, q0), q1 - 1))
    for q in sorted(rows):
        k0, k1 = max(ls.at(q), lt.at(q)), min(hs.at(q), ht.at(q))
        if k0 < k1:
            return q, k0
    return None


def _check_disjoint(m: Mask) -> None:
    """Refuse two triples sharing a (q, k) pair; only pairs whose q-ranges meet are compared."""
    order = sorted(range(len(m)), key=lambda i: m[i].q)
    for n, i in enumerate(order):
        for j in order[n + 1:]:
            if m[j].q[0] >= m[i].q[1]:
                break
            pair = _shared_pair(m[i], m[j])
            if pair is not None:
                a, b = sorted((i, j))
                raise HiercollError(f"mask[{b}]: overlaps mask[{a}] at (q={pair[0]}, k={pair[1]}); every "
                                    "(q, k) pair must be in one triple, cut one of them")


# ---- mask builders ----------------------------------------------------------------------------
def _check_cu_seqlens(cu_seqlens: Sequence[int]) -> tuple[int, ...]:
    cu = tuple(int(x) for x in cu_seqlens)
    if len(cu) < 2 or cu[0] != 0:
        raise HiercollError(f"cu_seqlens: {list(cu)}; give cumulative offsets [0, end of doc 1, ...]")
    for i, (a, b) in enumerate(pairwise(cu)):
        if b < a:
            raise HiercollError(f"cu_seqlens[{i + 1}]: {b} < {a}; offsets must be non-decreasing")
    return cu


def mask_from_cu_seqlens(cu_seqlens: Sequence[int], causal: bool) -> Mask:
    """Varlen attention over a packed batch: one triple (doc, doc, causal or full) per non-empty
    document [cu[i], cu[i+1]); no token attends across documents. Empty documents give none."""
    cu = _check_cu_seqlens(cu_seqlens)
    kind = MaskType.CAUSAL if causal else MaskType.FULL
    return tuple(MaskSlice((a, b), (a, b), kind) for a, b in pairwise(cu) if b > a)


def block_causal_mask(total_seqlen: int, block: int, global_block: int = 0) -> Mask:
    """Block-causal attention, with an optional leading global block.

    Tokens [0, global_block) are global: their queries attend to every token, one triple
    ([0, g), [0, T), full), and every later query attends to them. The rest, [g, T), is cut into
    blocks of `block` tokens (the last may be shorter); block [s, e) attends causally to itself,
    ([s, e), [s, e), causal), and fully to everything before it, ([s, e), [0, s), full), the
    global tokens included. With global_block = 0 the first block attends to itself only."""
    _positive("total_seqlen", total_seqlen)
    _positive("block", block)
    if isinstance(global_block, bool) or not 0 <= global_block <= total_seqlen:
        raise HiercollError(f"global_block: {global_block!r}; give a token count in 0..{total_seqlen}")
    out: list[MaskSlice] = []
    if global_block:
        out.append(MaskSlice((0, global_block), (0, total_seqlen), MaskType.FULL))
    for s in range(global_block, total_seqlen, block):
        e = min(s + block, total_seqlen)
        if s > 0:
            out.append(MaskSlice((s, e), (0, s), MaskType.FULL))
        out.append(MaskSlice((s, e), (s, e), MaskType.CAUSAL))
    return tuple(out)


# ---- step 1: chunk areas ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ChunkArea:
    """One query chunk: its tokens and its area per mask type (in `MASK_TYPES` order)."""

    index: int
    q: Interval
    by_type: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.by_type)


@dataclass(frozen=True, slots=True)
class ChunkAreas:
    """Step 1's result: every query chunk's area, the cost model dispatch balances."""

    total_seqlen: int
    chunk_size: int
    chunks: tuple[ChunkArea, ...]

    @property
    def totals(self) -> tuple[int, ...]:
        """Area per chunk: what dispatch balances (attention cost is proportional to it)."""
        return tuple(c.total for c in self.chunks)

    def of_type(self, kind: MaskType | str) -> tuple[int, ...]:
        i = MASK_TYPES.index(MaskType(kind))
        return tuple(c.by_type[i] for c in self.chunks)


MAX_CHUNKS = 1 << 20    # areas and the dispatch hold a few numbers per chunk; 4M chunks took 32 s


def _check_chunking(total_seqlen: int, chunk_size: int) -> int:
    """Number of chunks; refuses a sequence the chunks do not tile, or that would take more
    chunks than fit in memory (a mask range up to 2**62 was a MemoryError)."""
    _positive("total_seqlen", total_seqlen)
    _positive("chunk_size", chunk_size)
    n = divide_evenly(total_seqlen, chunk_size, lambda pad: (
        f"total_seqlen: {total_seqlen} is not a multiple of chunk_size {chunk_size}; "
        f"pad the sequence by {pad} tokens to {total_seqlen + pad} or pick a divisor"))
    if n > MAX_CHUNKS:
        raise HiercollError(f"chunk_size: {total_seqlen} tokens in chunks of {chunk_size} is {n} "
                            f"chunks, over {MAX_CHUNKS}; use chunks of at least "
                            f"{-(-total_seqlen // MAX_CHUNKS)} tokens")
    return n


def _chunks_of(s: MaskSlice, chunk_size: int) -> range:
    return range(s.q[0] // chunk_size, (s.q[1] - 1) // chunk_size + 1)


def chunk_areas(mask: MaskLike, total_seqlen: int, chunk_size: int) -> ChunkAreas:
    """Each query chunk's attention area, summed over the triples its queries meet, per type."""
    n = _check_chunking(total_seqlen, chunk_size)
    return _areas(check_mask(mask, total_seqlen), total_seqlen, chunk_size, n)


def _areas(m: Mask, total_seqlen: int, chunk_size: int, n: int) -> ChunkAreas:
    acc = [[0] * len(MASK_TYPES) for _ in range(n)]
    for s in m:
        t = MASK_TYPES.index(s.type)
        for c in _chunks_of(s, chunk_size):
            acc[c][t] += slice_area(s, (c * chunk_size, (c + 1) * chunk_size))
    chunks = tuple(ChunkArea(c, (c * chunk_size, (c + 1) * chunk_size), tuple(a)) for c, a in enumerate(acc))
    return ChunkAreas(total_seqlen, chunk_size, chunks)


# ---- step 2: dispatch -------------------------------------------------------------------------
Solver = Callable[[Sequence[int], int], Sequence[Sequence[int]]]
"""(area per chunk, cp_size) -> the chunk indices of each rank, cp_size lists of equal length."""


def greedy_solver(areas: Sequence[int], cp_size: int) -> list[list[int]]:
    """Largest chunk first, to the least-loaded rank that still has room (ties: lower chunk, then
    lower rank): the LPT baseline, with every rank taking the same number of chunks."""
    per_rank = len(areas) // cp_size
    heap = [(0, r) for r in range(cp_size)]
    out: list[list[int]] = [[] for _ in range(cp_size)]
    for c in sorted(range(len(areas)), key=lambda c: (-areas[c], c)):
        load, r = heapq.heappop(heap)
        out[r].append(c)
        if len(out[r]) < per_rank:
            heapq.heappush(heap, (load + areas[c], r))
    return out


def contiguous_solver(areas: Sequence[int], cp_size: int) -> list[list[int]]:
    """Rank r takes chunks [r*n, (r+1)*n): ring/llama3's layout, the unbalanced reference."""
    n = len(areas) // cp_size
    return [list(range(r * n, (r + 1) * n)) for r in range(cp_size)]


def zigzag_solver(areas: Sequence[int], cp_size: int) -> list[list[int]]:
    """Chunks dealt 0, 1, .., W-1, W-1, .., 0, 0, 1, ..: zigzag ring attention's layout, balanced
    for one causal sequence without looking at the areas."""
    out: list[list[int]] = [[] for _ in range(cp_size)]
    for c in range(len(areas)):
        p = c % (2 * cp_size)
        out[p if p < cp_size else 2 * cp_size - 1 - p].append(c)
    return out


SOLVERS: dict[str, Solver] = {"greedy": greedy_solver, "contiguous": contiguous_solver,
                              "zigzag": zigzag_solver}
"""Dispatch solvers by name; add one here to make it available to `dispatch` and `solve`."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Which chunks each rank hosts (ascending), its area, and each chunk's owner."""

    solver: str
    chunk_size: int
    rank_chunks: tuple[tuple[int, ...], ...]
    loads: tuple[int, ...]
    owner: tuple[int, ...]

    @property
    def imbalance(self) -> float:
        """Max over mean rank area: 1.0 is perfect balance (also when there is no area at all)."""
        mean = sum(self.loads) / len(self.loads)
        return max(self.loads) / mean if mean else 1.0


def _check_cp(n_chunks: int, cp_size: int) -> None:
    _positive("cp_size", cp_size)
    if n_chunks % cp_size:
        raise HiercollError(f"cp_size: {n_chunks} chunks do not split evenly over {cp_size} ranks; pick "
                            "chunk_size so that total_seqlen / chunk_size is a multiple of cp_size")


def _check_assignment(name: str, got: Sequence[Sequence[int]], n_chunks: int,
                      cp_size: int) -> tuple[tuple[int, ...], ...]:
    """A solver's answer, refused unless every chunk is on exactly one rank, n/W per rank."""
    if len(got) != cp_size:
        raise HiercollError(f"solver {name!r}: returned {len(got)} ranks for cp_size {cp_size}")
    per_rank = n_chunks // cp_size
    for r, cs in enumerate(got):
        if len(cs) != per_rank:
            raise HiercollError(f"solver {name!r}: rank {r} got {len(cs)} chunks; each rank takes {per_rank}")
    flat = sorted(c for cs in got for c in cs)
    if flat != list(range(n_chunks)):
        missing = sorted(set(range(n_chunks)) - set(flat))
        raise HiercollError(f"solver {name!r}: chunks {missing} are on no rank (or another is on two)")
    return tuple(tuple(sorted(cs)) for cs in got)


def dispatch(areas: ChunkAreas, cp_size: int, solver: str = "greedy") -> Dispatch:
    """Assign chunks to ranks with solver `solver` (a key of `SOLVERS`), each rank n/W chunks."""
    n = len(areas.chunks)
    _check_cp(n, cp_size)
    if solver not in SOLVERS:
        raise HiercollError(f"solver: unknown {solver!r}; use one of {', '.join(sorted(SOLVERS))}")
    totals = areas.totals
    chunks = _check_assignment(solver, SOLVERS[solver](totals, cp_size), n, cp_size)
    owner = [0] * n
    for r, cs in enumerate(chunks):
        for c in cs:
            owner[c] = r
    loads = tuple(sum(totals[c] for c in cs) for cs in chunks)
    return Dispatch(solver, areas.chunk_size, chunks, loads, tuple(owner))


# ---- step 3: host, needed, remote ranges and the transfer table -------------------------------
def merge(intervals: Iterable[Interval]) -> Ranges:
    """Sorted, disjoint, adjacent ones joined; empty ones dropped."""
    out: list[Interval] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return tuple(out)


def subtract(xs: Ranges, ys: Ranges) -> Ranges:
    """xs minus ys (both merged)."""
    out: list[Interval] = []
    j = 0
    for s, e in xs:
        while j < len(ys) and ys[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(ys) and ys[k][0] < e:
            if ys[k][0] > cur:
                out.append((cur, ys[k][0]))
            cur = max(cur, ys[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return tuple(out)


def intersect(xs: Ranges, ys: Ranges) -> Ranges:
    """xs and ys (both merged)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(xs) and j < len(ys):
        s, e = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if s < e:
            out.append((s, e))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def tokens(ranges: Iterable[Interval]) -> int:
    return sum(e - s for s, e in ranges)


def host_ranges(d: Dispatch) -> RangesPerRank:
    """Each rank's tokens: its chunks' token ranges, adjacent ones merged."""
    cs = d.chunk_size
    return tuple(merge((c * cs, (c + 1) * cs) for c in chunks) for chunks in d.rank_chunks)


def needed_ranges(mask: MaskLike, d: Dispatch, total_seqlen: int) -> RangesPerRank:
    """The keys each rank's queries attend to (hosted or not), merged."""
    return _needed(check_mask(mask, total_seqlen), d)


def _needed(m: Mask, d: Dispatch) -> RangesPerRank:
    cs = d.chunk_size
    per_rank: list[list[Interval]] = [[] for _ in d.rank_chunks]
    for s in m:
        for c in _chunks_of(s, cs):
            keys = slice_keys(s, (c * cs, (c + 1) * cs))
            if keys is not None:
                per_rank[d.owner[c]].append(keys)
    return tuple(merge(ivs) for ivs in per_rank)


def remote_ranges(needed: RangesPerRank, host: RangesPerRank) -> RangesPerRank:
    """Needed minus hosted: what each rank fetches, each token once (zero redundancy)."""
    return tuple(subtract(n, h) for n, h in zip(needed, host))


@dataclass(frozen=True, slots=True)
class Transfer:
    """Tokens `ranges` move from `src` (which hosts them) to `dst` (whose queries need them)."""

    src: int
    dst: int
    ranges: Ranges

    @property
    def tokens(self) -> int:
        return tokens(self.ranges)


def _by_owner(ranges: Ranges, owner: Sequence[int], chunk_size: int) -> list[tuple[int, Interval]]:
    """(hosting rank, piece) for `ranges` cut at chunk owners, ascending; same-owner pieces joined."""
    out: list[tuple[int, Interval]] = []
    for s, e in ranges:
        for c in range(s // chunk_size, (e - 1) // chunk_size + 1):
            a, b = max(s, c * chunk_size), min(e, (c + 1) * chunk_size)
            if out and out[-1][0] == owner[c] and out[-1][1][1] == a:
                out[-1] = (owner[c], (out[-1][1][0], b))
            else:
                out.append((owner[c], (a, b)))
    return out


def transfer_table(remote: RangesPerRank, d: Dispatch) -> tuple[Transfer, ...]:
    """Every (src, dst) pair with something to move, sorted by (src, dst)."""
    return _transfers(remote, d.owner, d.chunk_size)


def _transfers(remote: RangesPerRank, owner: Sequence[int], chunk_size: int) -> tuple[Transfer, ...]:
    pairs: dict[tuple[int, int], list[Interval]] = defaultdict(list)
    for dst, ranges in enumerate(remote):
        for src, iv in _by_owner(ranges, owner, chunk_size):
            pairs[(src, dst)].append(iv)
    return tuple(Transfer(s, t, merge(ivs)) for (s, t), ivs in sorted(pairs.items()))


# ---- step 4: the group-cast -------------------------------------------------------------------
def _dest_runs(host: Ranges, covers: Sequence[tuple[Interval, int]]) -> list[tuple[int, tuple[int, ...]]]:
    """(tokens, destinations) per run of host tokens, in host order, equal neighbours joined.
    `covers`: (range inside `host`, a rank that fetches it)."""
    starts: dict[int, list[int]] = defaultdict(list)
    ends: dict[int, list[int]] = defaultdict(list)
    for (s, e), d in covers:
        starts[s].append(d)
        ends[e].append(d)
    runs: list[tuple[int, tuple[int, ...]]] = []
    active: set[int] = set()
    for lo, hi in host:
        points = sorted({lo, hi} | {p for p in (*starts, *ends) if lo < p < hi})
        for a, b in pairwise(points):
            active.difference_update(ends.get(a, ()))
            active.update(starts.get(a, ()))
            dests = tuple(sorted(active))
            if runs and runs[-1][1] == dests:
                runs[-1] = (runs[-1][0] + b - a, dests)
            else:
                runs.append((b - a, dests))
        active.difference_update(ends.get(hi, ()))
    return runs


@dataclass(frozen=True, slots=True)
class KVCast:
    """One group-cast of K/V: who hosts what, who fetches what. `AttentionPlan.cast` is the
    whole exchange, `AttentionPlan.stages` its pieces (same inputs, a share of the outputs)."""

    host_ranges: RangesPerRank
    remote_ranges: RangesPerRank
    owner: tuple[int, ...]
    chunk_size: int

    @property
    def world_size(self) -> int:
        return len(self.host_ranges)

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return _transfers(self.remote_ranges, self.owner, self.chunk_size)

    def _input_splits(self, rank: int, row_elems: int) -> list[Split]:
        host = self.host_ranges[rank]
        covers = [(iv, d) for d, rr in enumerate(self.remote_ranges) if d != rank
                  for iv in intersect(rr, host)]
        return [Split(size=n * row_elems, peers=list(dests)) for n, dests in _dest_runs(host, covers)]

    def _output_splits(self, rank: int, row_elems: int) -> list[Split]:
        runs: list[tuple[int, int]] = []               # (source, tokens)
        for src, (a, b) in _by_owner(self.remote_ranges[rank], self.owner, self.chunk_size):
            if runs and runs[-1][0] == src:
                runs[-1] = (src, runs[-1][1] + b - a)
            else:
                runs.append((src, b - a))
        return [Split(size=n * row_elems, peers=[src]) for src, n in runs]

    def group_cast_splits(self, row_elems: int) -> GroupSplits:
        """Forward K/V: host rows in, remote rows out (layout in the module doc); sizes are
        elements, `row_elems` per token (e.g. K and V of all KV heads)."""
        _positive("row_elems", row_elems)
        return GroupSplits(ranks=[RankSplits(input=self._input_splits(r, row_elems),
                                             output=self._output_splits(r, row_elems))
                                  for r in range(self.world_size)])

    def group_reduce_splits(self, row_elems: int) -> GroupSplits:
        """Backward dK/dV: each fetcher's partial gradient summed into the host's rows."""
        return transpose(self.group_cast_splits(row_elems))

    def magi_args(self, row_elems: int) -> MagiArgs:
        """The group-cast in MagiAttention's own argument form (tokens)."""
        return group_splits_to_magi(self.group_cast_splits(row_elems), row_elems,
                                    [tokens(h) for h in self.host_ranges])


def _take(ranges: Ranges, start: int, count: int) -> Ranges:
    """The tokens number start .. start+count-1 of `ranges` (counted in ascending order)."""
    out: list[Interval] = []
    pos = 0
    for s, e in ranges:
        a, b = max(s, s + start - pos), min(e, s + start + count - pos)
        if a < b:
            out.append((a, b))
        pos += e - s
    return tuple(out)


def split_stages(cast: KVCast, degree: int) -> tuple[KVCast, ...]:
    """Each rank's remote tokens cut into `degree` consecutive pieces of near-equal count (the
    first `n % degree` one token longer): stage i fetches piece i of every rank, so attention on
    stage i's keys overlaps stage i+1's transfer. Inputs stay the whole host tokens."""
    _positive("degree", degree)
    stages: list[list[Ranges]] = [[] for _ in range(degree)]
    for rr in cast.remote_ranges:
        base, extra = divmod(tokens(rr), degree)
        start = 0
        for i in range(degree):
            n = base + (1 if i < extra else 0)
            stages[i].append(_take(rr, start, n))
            start += n
    return tuple(KVCast(cast.host_ranges, tuple(st), cast.owner, cast.chunk_size) for st in stages)


# ---- the whole pipeline -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """Everything `solve` worked out, per rank r: `host_ranges[r]`, `needed_ranges[r]`,
    `remote_ranges[r]`; the transfer table; the group-cast / group-reduce splits; the stages."""

    total_seqlen: int
    chunk_size: int
    cp_size: int
    degree: int
    mask: Mask
    areas: ChunkAreas
    dispatch: Dispatch
    host_ranges: RangesPerRank
    needed_ranges: RangesPerRank
    remote_ranges: RangesPerRank

    @property
    def imbalance(self) -> float:
        return self.dispatch.imbalance

    @property
    def cast(self) -> KVCast:
        return KVCast(self.host_ranges, self.remote_ranges, self.dispatch.owner, self.chunk_size)

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return self.cast.transfers

    def group_cast_splits(self, row_elems: int) -> GroupSplits:
        return self.cast.group_cast_splits(row_elems)

    def group_reduce_splits(self, row_elems: int) -> GroupSplits:
        return self.cast.group_reduce_splits(row_elems)

    def magi_args(self, row_elems: int) -> MagiArgs:
        return self.cast.magi_args(row_elems)

    def stages(self, degree: int | None = None) -> tuple[KVCast, ...]:
        """The exchange in `degree` group-casts (default: the plan's degree)."""
        return split_stages(self.cast, self.degree if degree is None else degree)


def solve(mask: MaskLike, total_seqlen: int, chunk_size: int, cp_size: int, solver: str = "greedy",
          degree: int = 1) -> AttentionPlan:
    """Mask -> areas -> dispatch -> host/needed/remote ranges, checked up front."""
    n = _check_chunking(total_seqlen, chunk_size)
    _check_cp(n, cp_size)
    _positive("degree", degree)
    m = check_mask(mask, total_seqlen)
    areas = _areas(m, total_seqlen, chunk_size, n)
    d = dispatch(areas, cp_size, solver)
    host = host_ranges(d)
    needed = _needed(m, d)
    return AttentionPlan(total_seqlen, chunk_size, cp_size, degree, m, areas, d, host, needed,
                         remote_ranges(needed, host))


# ---- MagiAttention's argument form ------------------------------------------------------------
NonNegative = Annotated[int, Field(ge=0)]


class MagiRankArgs(BaseModel):
    """One rank's group-cast arguments as MagiAttention takes them, in tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input_split_sizes: list[NonNegative] = Field(default_factory=list)
    dst_indices: list[list[int]] = Field(default_factory=list, description="destinations per input split")
    output_split_sizes: list[NonNegative] = Field(default_factory=list)
    src_index: list[int] = Field(default_factory=list, description="the source of each output split")
    input_tokens: NonNegative | None = Field(default=None, description="the rank's tokens; when given, "
                                             "input_split_sizes must sum to it")


class MagiArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    row_elems: int = Field(ge=1, description="elements per token row")
    ranks: list[MagiRankArgs]


def _check_magi_rank(r: int, a: MagiRankArgs, world: int) -> None:
    where = f"ranks[{r}]"
    if len(a.dst_indices) != len(a.input_split_sizes):
        raise HiercollError(f"{where}.dst_indices: {len(a.dst_indices)} lists for {len(a.input_split_sizes)} "
                            "input splits; give one destination list per input split")
    if len(a.src_index) != len(a.output_split_sizes):
        raise HiercollError(f"{where}.src_index: {len(a.src_index)} sources for {len(a.output_split_sizes)} "
                            "output splits; give one source rank per output split")
    if a.input_tokens is not None and sum(a.input_split_sizes) != a.input_tokens:
        raise HiercollError(f"{where}.input_split_sizes: sum to {sum(a.input_split_sizes)} but the rank "
                            f"holds {a.input_tokens} tokens; cover every token once (no-destination "
                            "splits have dst_indices [])")
    for i, dsts in enumerate(a.dst_indices):
        bad = [d for d in dsts if not 0 <= d < world]
        if bad:
            raise HiercollError(f"{where}.dst_indices[{i}]: ranks {bad} outside 0..{world - 1}")
        if len(set(dsts)) != len(dsts):
            raise HiercollError(f"{where}.dst_indices[{i}]: {dsts} lists a rank twice")
    for j, s in enumerate(a.src_index):
        if not 0 <= s < world:
            raise HiercollError(f"{where}.src_index[{j}]: rank {s} outside 0..{world - 1}")


def _check_magi_pairs(ranks: Sequence[MagiRankArgs]) -> None:
    """What each source sends each destination must be what that destination's outputs expect."""
    sent: dict[tuple[int, int], int] = defaultdict(int)
    got: dict[tuple[int, int], int] = defaultdict(int)
    for s, a in enumerate(ranks):
        for n, dsts in zip(a.input_split_sizes, a.dst_indices):
            for d in dsts:
                sent[(s, d)] += n
    for d, a in enumerate(ranks):
        for n, s in zip(a.output_split_sizes, a.src_index):
            got[(s, d)] += n
    pairs = sorted(set(sent) | set(got))
    for s, d in pairs:      # an output split its source does not (fully) send: the likelier typo
        if got[(s, d)] > sent[(s, d)]:
            j = ranks[d].src_index.index(s)
            raise HiercollError(f"ranks[{d}].src_index[{j}]: rank {d} expects {got[(s, d)]} tokens from rank "
                                f"{s} but rank {s}'s dst_indices send it {sent[(s, d)]}; fix the sizes or "
                                "the sources")
    for s, d in pairs:
        if sent[(s, d)] > got[(s, d)]:
            i = next(i for i, dsts in enumerate(ranks[s].dst_indices) if d in dsts)
            raise HiercollError(f"ranks[{s}].dst_indices[{i}]: rank {s} sends {sent[(s, d)]} tokens to rank "
                                f"{d} but rank {d}'s src_index expects {got[(s, d)]} from it; add output "
                                "splits or drop the destination")


def magi_to_group_splits(args: MagiArgs | Mapping[str, Any], source: str | None = None) -> GroupSplits:
    """MagiAttention's per-rank (input_split_sizes, dst_indices, output_split_sizes, src_index)
    in tokens, checked (one line naming the rank and field), as GroupSplits in elements."""
    if not isinstance(args, MagiArgs):
        try:
            args = MagiArgs.model_validate(args)
        except ValidationError as err:
            raise _one_line(err, "magi", source) from None
    try:
        for r, a in enumerate(args.ranks):
            _check_magi_rank(r, a, len(args.ranks))
        _check_magi_pairs(args.ranks)
    except HiercollError as err:
        raise HiercollError(f"{source}: {err}" if source else str(err)) from None
    row = args.row_elems
    return GroupSplits(ranks=[RankSplits(
        input=[Split(size=n * row, peers=list(d)) for n, d in zip(a.input_split_sizes, a.dst_indices)],
        output=[Split(size=n * row, peers=[s]) for n, s in zip(a.output_split_sizes, a.src_index)])
        for a in args.ranks])


def load_magi_splits(path: str | Path) -> GroupSplits:
    """A MagiAttention-form file (YAML/JSON: `{row_elems: N, ranks: [{input_split_sizes: ...}]}`)."""
    p = Path(path)
    return magi_to_group_splits(_as_mapping(read_structured_file(p), p), str(p))


def _as_mapping(data: object, p: Path) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise HiercollError(f"{p}: expected a mapping {{row_elems: N, ranks: [...]}}")
    return data


def group_splits_to_magi(splits: GroupSplits, row_elems: int,
                         input_tokens: Sequence[int] | None = None) -> MagiArgs:
    """GroupSplits (elements) of a group-cast as MagiAttention's arguments (tokens)."""
    _positive("row_elems", row_elems)
    ranks = []
    for r, rs in enumerate(splits.ranks):
        for side in ("input", "output"):
            for i, sp in enumerate(getattr(rs, side)):
                if sp.size % row_elems:
                    raise HiercollError(f"splits.ranks[{r}].{side}[{i}].size: {sp.size} is not a whole number "
                                        f"of rows of {row_elems} elements")
        ranks.append(MagiRankArgs(
            input_split_sizes=[sp.size // row_elems for sp in rs.input],
            dst_indices=[list(sp.peers) for sp in rs.input],
            output_split_sizes=[sp.size // row_elems for sp in rs.output],
            src_index=[_one_source(r, i, sp) for i, sp in enumerate(rs.output)],
            input_tokens=None if input_tokens is None else input_tokens[r]))
    return MagiArgs(row_elems=row_elems, ranks=ranks)


def _one_source(r: int, i: int, sp: Split) -> int:
    if len(sp.peers) != 1:
        raise HiercollError(f"splits.ranks[{r}].output[{i}].peers: {sp.peers}; a group_cast output split "
                            "has exactly one source")
    return sp.peers[0]
