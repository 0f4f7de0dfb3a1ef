"""Symbolic execution: which input contributions every element range holds, and with which weight.

A content is a sorted tuple of terms (source, delta, weight): element e of the region holds
`weight` times input element e + delta of rank `source` (source -1-r stands for rank r's output
as it was before the call, which group_reduce accumulates into). Weights are exact rationals: an
`int` while only copies and plain sums touched the element (a count of copies), a
`fractions.Fraction` once a reduce's `scale` applied. A scale is read back as the rational it
stands for (`exact_scale`: the float 1/3 is 1/3), so avg's 1/n must come out as exactly 1/n
per contribution and a scale that is 2% off is a wrong weight, not a rounding. Buffers are kept
as sorted, non-overlapping segments, so a copy of a million elements is one segment operation.

The walk is generic over what a segment holds (`Algebra`): `Terms` (this module: the weighted
sum, order forgotten; the postcondition) or `reduction_order.Exprs` (the expression tree, order
and association kept; the rank-identical property). One walk, two questions.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Generic, Protocol, TypeVar

from hiercoll.collectives import CollectiveSpec, Kind, ReduceOp
from hiercoll.schedule import INPUT, OUTPUT, Op, OpKind, Region

Weight = int | Fraction
Term = tuple[int, int, Weight]
Content = tuple[Term, ...] | None          # None: nothing written yet (garbage)

SCALE_DENOMINATOR = 1 << 24   # scales are read as rationals with denominators up to this


def exact_scale(scale: float) -> Weight:
    """The rational a float scale stands for: the simplest fraction (denominator <= 2^24) whose
    float is exactly `scale` (1.0/3 -> 1/3, 1.0/16 -> 1/16, 1.02/16 -> 51/800), else the float's
    exact binary value. Never rounds a wrong scale onto a right one: the fraction found has the
    same float, so it is `scale`'s own value whenever a simple one exists."""
    if scale == 1.0:
        return 1
    exact = Fraction(scale)
    simple = exact.limit_denominator(SCALE_DENOMINATOR)
    return simple if float(simple) == scale else exact


def scaled(content: Content, by: Weight) -> Content:
    """Every weight of `content` times `by` (terms whose weight becomes 0 contribute nothing)."""
    if content is None or by == 1:
        return content
    return tuple((s, d, c * by) for s, d, c in content if c * by != 0)


def shift(content: Content, by: int) -> Content:
    """Content moved by `by` elements (to dst offset = src offset + by)."""
    if content is None or by == 0:
        return content
    return tuple((s, d - by, c) for s, d, c in content)


def combine(parts: list[Content]) -> Content:
    written = [p for p in parts if p is not None]
    if len(written) < len(parts):
        return None
    acc: dict[tuple[int, int], Weight] = {}
    for p in written:
        for s, d, c in p:
            acc[(s, d)] = acc.get((s, d), 0) + c
    return tuple(sorted((s, d, c) for (s, d), c in acc.items() if c != 0))


C = TypeVar("C")


class Algebra(Protocol[C]):
    """What a segment holds and how ops transform it (None: nothing written yet)."""

    def leaf(self, source: int) -> C:
        """Element e of input `source` (or -1-r: rank r's output before the call)."""
        ...

    def shift(self, content: C | None, by: int) -> C | None:
        """`content` moved by `by` elements (to dst offset = src offset + by)."""
        ...

    def reduce(self, srcs: Sequence[C | None], scale: float, acc: C | None,
               accumulate: bool) -> C | None:
        """A reduce op: scale * (srcs in order) [+ acc, the destination's value, if
        `accumulate`]."""
        ...


class Terms:
    """Contents as weighted sums (see the module doc): the postcondition's algebra."""

    def leaf(self, source: int) -> Content:
        return ((source, 0, 1),)

    def shift(self, content: Content, by: int) -> Content:
        return shift(content, by)

    def reduce(self, srcs: Sequence[Content], scale: float, acc: Content,
               accumulate: bool) -> Content:
        k = exact_scale(scale)
        return combine([scaled(c, k) for c in srcs] + ([acc] if accumulate else []))


@dataclass
class SegmentBuffer(Generic[C]):
    """[starts[i], starts[i+1]) holds contents[i]; the last start is the buffer's end."""

    size: int
    starts: list[int] = field(default_factory=list)
    contents: list[C | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.starts:
            self.starts, self.contents = [0, self.size], [None]

    def _split(self, at: int) -> None:
        if at <= 0 or at >= self.size:
            return
        i = bisect_right(self.starts, at) - 1
        if self.starts[i] != at:
            self.starts.insert(i + 1, at)
            self.contents.insert(i + 1, self.contents[i])

    def read(self, lo: int, hi: int) -> list[tuple[int, int, C | None]]:
        """[(start, end, content)] covering [lo, hi)."""
        if hi <= lo:
            return []
        i = bisect_right(self.starts, lo) - 1
        out = []
        while i < len(self.contents) and self.starts[i] < hi:
            out.append((max(lo, self.starts[i]), min(hi, self.starts[i + 1]), self.contents[i]))
            i += 1
        return out

    def write(self, lo: int, hi: int, pieces: list[tuple[int, int, C | None]]) -> None:
        if hi <= lo:
            return
        self._split(lo)
        self._split(hi)
        i, j = bisect_left(self.starts, lo), bisect_left(self.starts, hi)
        new_starts = [a for a, _, _ in pieces]
        self.starts[i:j] = new_starts
        self.contents[i:j] = [c for _, _, c in pieces]


class SymbolicMemory(Generic[C]):
    """Every rank's buffers as segments of `algebra`'s contents; `run` applies one op."""

    def __init__(self, spec: CollectiveSpec, sizes: list[dict[str, int]],
                 algebra: Algebra[C] | None = None):
        self.algebra: Algebra[C] = algebra if algebra is not None else Terms()  # type: ignore[assignment]
        self.bufs: list[dict[str, SegmentBuffer[C]]] = []
        for r, bs in enumerate(sizes):
            d = {name: SegmentBuffer[C](n) for name, n in bs.items()}
            if bs.get(INPUT):
                d[INPUT].contents = [self.algebra.leaf(r)]
            if spec.accumulates_output and bs.get(OUTPUT):
                d[OUTPUT].contents = [self.algebra.leaf(-1 - r)]
            self.bufs.append(d)

    def _read(self, reg: Region, to_offset: int) -> list[tuple[int, int, C | None]]:
        by = to_offset - reg.offset
        shift_by = self.algebra.shift
        return [(a + by, b + by, shift_by(c, by))
                for a, b, c in self.bufs[reg.rank][reg.buffer].read(reg.offset, reg.offset + reg.count)]

    def run(self, op: Op) -> None:
        d = op.dst
        if op.kind == OpKind.COPY:
            pieces = self._read(op.srcs[0], d.offset)
        else:
            # dst <- [dst +] scale * (src_0 + src_1 ...): the scale weighs the sources only
            sources = [self._read(s, d.offset) for s in op.srcs]
            if op.accumulate:
                sources.append(self._read(d, d.offset))
            n, scale, acc, red = len(op.srcs), op.scale, op.accumulate, self.algebra.reduce
            pieces = [(a, b, red(parts[:n], scale, parts[n] if acc else None, acc))
                      for a, b, parts in _merge(sources, d.offset, d.offset + d.count)]
        self.bufs[d.rank][d.buffer].write(d.offset, d.offset + d.count, pieces)


def _merge(sources: list[list[tuple[int, int, C | None]]], lo: int,
           hi: int) -> list[tuple[int, int, list[C | None]]]:
    """Pointwise zip of several piece lists over [lo, hi): (start, end, [content per source])."""
    cuts = sorted({lo, hi} | {a for src in sources for a, _, _ in src})
    out = []
    idx = [0] * len(sources)
    for a, b in zip(cuts, cuts[1:]):
        parts = []
        for k, src in enumerate(sources):
            while idx[k] < len(src) and src[idx[k]][1] <= a:
                idx[k] += 1
            parts.append(src[idx[k]][2])
        out.append((a, b, parts))
    return out


def expected_output(spec: CollectiveSpec, rank: int) -> SegmentBuffer[Content]:
    """What rank's output must hold by the collective's definition: each contribution with
    weight 1, except avg's, which weigh exactly 1/n (n ranks; for group_reduce, n sources of the
    output split; the output's own earlier value keeps weight 1)."""
    n, w = spec.output_count(rank), spec.world_size
    buf = SegmentBuffer[Content](n)
    k = spec.kind
    avg = spec.reduce_op == ReduceOp.AVG
    each: Weight = Fraction(1, w) if avg else 1
    everyone = tuple((s, 0, each) for s in range(w))
    if k == Kind.ALL_REDUCE or (k == Kind.REDUCE and rank == spec.root):
        buf.contents = [everyone]
    elif k == Kind.REDUCE_SCATTER:
        off = spec.shard(rank)[0]
        buf.contents = [tuple((s, off, each) for s in range(w))]
    elif k == Kind.BROADCAST:
        buf.contents = [((spec.root, 0, 1),)]
    elif k == Kind.ALL_GATHER:
        buf.write(0, n, [(spec.shard(s)[0], spec.shard(s)[0] + spec.shard(s)[1],
                          ((s, -spec.shard(s)[0], 1),)) for s in range(w) if spec.shard(s)[1]])
    elif k == Kind.ALL_TO_ALL:
        b = spec.count // w
        if b:
            buf.write(0, n, [(s * b, (s + 1) * b, ((s, rank * b - s * b, 1),)) for s in range(w)])
    elif k in (Kind.GROUP_CAST, Kind.GROUP_REDUCE):
        base: Content = ((-1 - rank, 0, 1),) if k == Kind.GROUP_REDUCE else None
        buf.contents = [base]
        weight_at = _split_weights(spec, rank) if k == Kind.GROUP_REDUCE and avg else None
        for (s, d), ps in spec.pair_streams.items():
            if d != rank:
                continue
            for seg in ps.segments:
                lo, hi = seg.dst_offset, seg.dst_offset + seg.count
                cur = buf.read(lo, hi)
                weight = weight_at(lo) if weight_at else 1
                term = ((s, seg.src_offset - seg.dst_offset, weight),)
                buf.write(lo, hi, [(a, b2, combine([c if c is not None else (), term])) for a, b2, c in cur])
    return buf


def _split_weights(spec: CollectiveSpec, rank: int) -> Callable[[int], Weight]:
    """group_reduce avg: offset in rank's output -> 1/(sources of the split holding it)."""
    assert spec.splits is not None
    starts, weights, pos = [], [], 0
    for sp in spec.splits.ranks[rank].output:
        starts.append(pos)
        weights.append(Fraction(1, max(len(sp.peers), 1)))
        pos += sp.size

    def weight_at(offset: int) -> Weight:
        # segments lie inside one split; a zero-size split shares its start with the next
        return weights[bisect_right(starts, offset) - 1]
    return weight_at
