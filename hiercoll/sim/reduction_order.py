"""Rank-identical results: the expression tree behind every output element, compared across ranks.

Floating-point addition is not associative, so two ranks that sum the same terms in a different
order or grouping can end with different bits, and a model whose replicas see different
gradients drifts apart. A plan is rank-identical when, for every element that several ranks must
hold (all_reduce, all_gather, broadcast), every rank's value comes from the same expression: the
same terms, in the same order, with the same grouping, scale and rounding points; then the same
arithmetic gives the same bits, whatever runs it.

The walk is the postcondition's symbolic execution (`symbolic.SymbolicMemory`) with another
algebra: a content is an expression tree instead of a weighted sum. Leaves are input elements
(`x<rank>`); a node is one reduce op's arithmetic as the kernels do it (`kernels/program.py`): the
sources converted to the accumulator and folded left to right, times `scale`, plus the
destination's old value when the op accumulates, then stored (rounded) in the dtype. Copies move
trees unchanged. Two trees are equal only if the arithmetic is the same, except for what IEEE
arithmetic guarantees anyway: `a + b == b + a` (the first two sources of a fold are unordered),
a one-source reduce with scale 1 is a copy, and max/min give the same bits in any order.

Trees are interned (a node is an int), and a content is (node, delta): element e holds the
node evaluated at element e + delta, so a copy to another offset is O(1), as in `symbolic.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hiercoll.collectives import SHARED_OUTPUT, CollectiveSpec, Kind, ReduceOp
from hiercoll.schedule import OUTPUT, Op, Schedule
from hiercoll.sim.symbolic import SegmentBuffer, SymbolicMemory

Expr = tuple[int, int]              # (node id, delta)
Node = tuple[object, ...]          # ("x", source) or ("+", scale, children, acc)

MAX_REPORTED = 5
MAX_RENDER_NODES = 24


def applies(spec: CollectiveSpec) -> bool:
    """Whether the property is asked of `spec`: ranks hold the same output elements."""
    return spec.kind in SHARED_OUTPUT and spec.world_size > 1


@dataclass
class Exprs:
    """The expression-tree algebra (see the module doc), with every node's first creator."""

    nodes: list[Node] = field(default_factory=list)
    ids: dict[Node, int] = field(default_factory=dict)
    creator: dict[int, str] = field(default_factory=dict)   # node -> id of the op that built it
    current_op: str = ""

    def intern(self, node: Node) -> int:
        i = self.ids.get(node)
        if i is None:
            i = self.ids[node] = len(self.nodes)
            self.nodes.append(node)
            if self.current_op:
                self.creator[i] = self.current_op
        return i

    def leaf(self, source: int) -> Expr:
        return (self.intern(("x", source)), 0)

    def shift(self, content: Expr | None, by: int) -> Expr | None:
        return content if content is None or by == 0 else (content[0], content[1] - by)

    def reduce(self, srcs: Sequence[Expr | None], scale: float, acc: Expr | None,
               accumulate: bool) -> Expr | None:
        if any(s is None for s in srcs) or (accumulate and acc is None):
            return None
        kids = [s for s in srcs if s is not None]
        if len(kids) == 1 and scale == 1.0 and not accumulate:
            return kids[0]                    # x * 1.0, stored in the dtype x came from: a copy
        if len(kids) >= 2 and kids[1] < kids[0]:
            kids[0], kids[1] = kids[1], kids[0]   # a + b == b + a, bit for bit
        base = kids[0][1]
        rel = tuple((n, d - base) for n, d in kids)
        old = (acc[0], acc[1] - base) if accumulate and acc is not None else None
        return (self.intern(("+", scale, rel, old)), base)

    def render(self, expr: Expr, budget: int = MAX_RENDER_NODES) -> str:
        """A tree in words: x2 is rank 2's input element, (a + b + c) one reduce (folded left to
        right), *s its scale, [+= d] the old destination value it accumulates."""
        left = [budget]

        def go(node: int, delta: int) -> str:
            left[0] -= 1
            if left[0] < 0:
                return "..."
            n = self.nodes[node]
            if n[0] == "x":
                src = int(n[1])  # type: ignore[call-overload]
                name = f"x{src}" if src >= 0 else f"out{-1 - src}"
                return name + (f"[{delta:+d}]" if delta else "")
            _, scale, kids, old = n
            body = " + ".join(go(c, delta + d) for c, d in kids)  # type: ignore[attr-defined]
            text = f"({body})" + (f"*{scale:g}" if scale != 1.0 else "")
            if old is not None:
                text += f" [+= {go(old[0], delta + old[1])}]"  # type: ignore[index]
            return text
        return go(*expr)


@dataclass(frozen=True)
class OrderReport:
    """`identical` is None where the property does not apply (ranks hold different outputs)."""

    identical: bool | None
    problems: list[str]
    notes: list[str]


Writers = dict[int, list[tuple[int, int, str]]]   # rank -> (lo, hi, op id) of output writes


def rank_expressions(schedule: Schedule, order: Sequence[Op]
                     ) -> tuple[Exprs, SymbolicMemory[Expr], Writers]:
    """Every buffer's expression trees after running `order` (a topological order), and which
    ops wrote each rank's output."""
    exprs = Exprs()
    mem: SymbolicMemory[Expr] = SymbolicMemory(
        schedule.spec, [schedule.buffers(r) for r in range(schedule.world_size)], exprs)
    writers: Writers = {}
    for op in order:
        exprs.current_op = op.id
        mem.run(op)
        if op.dst.buffer == OUTPUT:
            writers.setdefault(op.dst.rank, []).append(
                (op.dst.offset, op.dst.offset + op.dst.count, op.id))
    exprs.current_op = ""
    return exprs, mem, writers


def check_reduction_order(schedule: Schedule, order: Sequence[Op]) -> OrderReport:
    """For kinds whose outputs ranks share: every rank's output element has the same expression
    tree as rank 0's; else which ranks, elements and ops differ."""
    spec = schedule.spec
    if not applies(spec):
        return OrderReport(None, [], [])
    if spec.kind == Kind.ALL_REDUCE and spec.reduce_op in (ReduceOp.MAX, ReduceOp.MIN):
        return OrderReport(True, [], [f"{spec.reduce_op.value} gives the same bits in any order; "
                                      "the postcondition covers it"])
    exprs, mem, writers = rank_expressions(schedule, order)
    ref = mem.bufs[0][OUTPUT]
    problems: list[str] = []
    for r in range(1, schedule.world_size):
        for lo, hi, got, want in _differences(mem.bufs[r][OUTPUT], ref):
            problems.append(_describe(exprs, writers, r, lo, hi, got, want))
            if len(problems) >= MAX_REPORTED:
                return OrderReport(False, problems, [])
    return OrderReport(not problems, problems, [])


def _differences(got: SegmentBuffer[Expr], want: SegmentBuffer[Expr]
                 ) -> list[tuple[int, int, Expr | None, Expr | None]]:
    """Ranges where two output buffers hold different expressions (first of each run)."""
    out = []
    for lo, hi, g in got.read(0, got.size):
        for a, b, w in want.read(lo, hi):
            if g != w:
                out.append((a, b, g, w))
                break
    return out


def _describe(exprs: Exprs, writers: Writers, rank: int, lo: int, hi: int, got: Expr | None,
              want: Expr | None) -> str:
    def what(r: int, e: Expr | None) -> str:
        last = [w for a, b, w in writers.get(r, []) if a < hi and lo < b]
        by = f" (written by op {last[-1]}" + (f", this tree first summed by op {exprs.creator[e[0]]})"
                                                if e is not None and e[0] in exprs.creator
                                                and exprs.creator[e[0]] != last[-1] else ")") \
            if last else ""
        return ("nothing" if e is None else exprs.render(e)) + by
    return (f"ranks differ: r{rank}.output[{lo}:{hi}] = {what(rank, got)}, but r0.output = "
            f"{what(0, want)}; sum each element once (or in one fixed order on every rank) and "
            "copy it")
