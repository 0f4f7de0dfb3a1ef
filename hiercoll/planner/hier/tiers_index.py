"""`hier_tiers`' label indices by formula (mirrors the loops of tiers_build.py), so resolving a
peer's label never builds the peer: at 4096 ranks building each peer made planning ~10x slower.

Reduce-scatter on rank x (node a): loop 1 over every target in `target_order`, per chunk the L-1
scatter copies and, for a target leaving at level 0, its send (a reduce when it has more than one
source, then the copy); loop 2 per target leaving at a higher level, per chunk reduce + copy;
then one final reduce per chunk. Targets of one leaving level f form a class of
(m_f - 1) x kept(f) nodes, ordered by (first key digit, relative digits above f).
All-gather: a prologue (own copy for all_gather, L-1 forwards of my shard), then per level from
the top kept(j) x (m_j - 1) sends per chunk, in the order of `held_position`.
"""

from __future__ import annotations

from hiercoll.collectives import Kind
from hiercoll.planner.context import ParamsT, PlanContext
from hiercoll.planner.hier.common import Place
from hiercoll.planner.hier.levels import Levels
from hiercoll.planner.hier.tiers_build import arrival_index, relative, ring_step, step_of
from hiercoll.planner.labels import FinalReduceLabel, Label, ScatterLabel, TierGatherLabel, TierSendLabel


def class_size(lv: Levels, f: int) -> int:
    """Targets whose shard leaves a rank at level f."""
    return (lv.radices[f] - 1) * lv.kept(f)


def class_position(lv: Levels, pl: Place, t: int) -> int:
    """Position of target t among those leaving my node at its level (`target_order`'s key)."""
    f = lv.first_difference(pl.node, t)
    if lv.is_ring(f):
        first = ring_step(lv, pl.node, f, t)
    elif pl.node_swizzle:
        first = relative(lv, pl, t, f) - 1
    else:
        first = step_of(lv, pl, f, lv.digit(pl.node, f), lv.digit(t, f))
    pos = first
    for j in range(f + 1, lv.count):
        pos = pos * lv.radices[j] + relative(lv, pl, t, j)
    return pos


def _level0_send_ops(lv: Levels, gpus: int, step: int) -> int:
    """Ops of one level-0 send per chunk: the copy, after a reduce when it sums several sources."""
    return 2 if gpus > 1 or (lv.is_ring(0) and step != 0) else 1


def _loop1_before(lv: Levels, gpus: int, k: int, before: int) -> int:
    """Loop-1 ops of the first `before` level-0 targets (all chunks)."""
    scatter = gpus - 1 if gpus > 1 else 0
    if gpus == 1 and lv.is_ring(0):
        ones = min(before, lv.kept(0))     # ring step 0 comes first: kept(0) targets of one op
        return k * (ones + 2 * (before - ones))
    return k * before * (scatter + _level0_send_ops(lv, gpus, 0))


def rs_parts(lv: Levels, gpus: int, k: int) -> tuple[int, int]:
    """(ops of loop 1, ops of loop 2) on every rank."""
    n, size0 = lv.num_nodes, class_size(lv, 0)
    scatter = gpus - 1 if gpus > 1 else 0
    loop1 = _loop1_before(lv, gpus, k, size0) + k * scatter * (n - size0)
    return loop1, 2 * k * (n - 1 - size0)


def rs_length(lv: Levels, gpus: int, k: int) -> int:
    loop1, loop2 = rs_parts(lv, gpus, k)
    return loop1 + loop2 + k


def rs_index(ctx: PlanContext[ParamsT], lv: Levels, pl: Place, label: Label) -> int:
    k, g = ctx.params.chunks, pl.gpus
    loop1, loop2 = rs_parts(lv, g, k)
    if isinstance(label, FinalReduceLabel):
        return loop1 + loop2 + label.chunk
    if not isinstance(label, ScatterLabel | TierSendLabel):
        raise KeyError(label)
    t, c = label.target, label.chunk
    scatter = g - 1 if g > 1 else 0
    f = lv.first_difference(pl.node, t)
    pos = class_position(lv, pl, t) if t != pl.node else 0
    size0 = class_size(lv, 0)
    if f == 0:
        step = ring_step(lv, pl.node, 0, t)
        start = _loop1_before(lv, g, k, pos) + c * (scatter + _level0_send_ops(lv, g, step))
        if isinstance(label, ScatterLabel):
            return start + pl.peer_position(label.peer)
        return start + scatter + _level0_send_ops(lv, g, step) - 1
    if isinstance(label, ScatterLabel):
        earlier = sum(class_size(lv, i) for i in range(1, f)) + pos    # own node last
        return _loop1_before(lv, g, k, size0) + k * scatter * earlier + c * scatter + pl.peer_position(label.peer)
    earlier = sum(class_size(lv, i) for i in range(1, f)) + pos
    return loop1 + 2 * k * earlier + 2 * c + 1


def held_position(lv: Levels, pl: Place, node: int, t: int) -> int:
    """Position of shard t in `node`'s all-gather held list (the `held_key` order): its own 0,
    then kept(j) + the rank among level-j arrivals for a shard arriving at level j."""
    if t == node:
        return 0
    j = lv.first_difference(node, t)
    m, v, d = lv.radices[j], lv.digit(t, j), lv.digit(node, j)
    owner = held_position(lv, pl, lv.with_digit(node, j, v), t)
    if lv.is_ring(j):
        rank = ((d - 1 - v) % m) * lv.kept(j) + owner
    else:
        rank = owner * (m - 1) + arrival_index(lv, pl, j, v, d)
    return lv.kept(j) + rank


def ag_index(ctx: PlanContext[ParamsT], lv: Levels, pl: Place, label: Label, base: int) -> int:
    if not isinstance(label, TierGatherLabel):
        raise KeyError(label)
    k, g = ctx.params.chunks, pl.gpus
    x, dest, t, c = pl.node, label.target, label.shard, label.chunk
    start = base + (k if ctx.spec.kind == Kind.ALL_GATHER else 0) + k * (g - 1)
    j = lv.first_difference(x, dest)
    start += sum(lv.kept(i) * (lv.radices[i] - 1) * k for i in range(j + 1, lv.count))
    m, d = lv.radices[j], lv.digit(x, j)
    if lv.is_ring(j):
        s = (d - lv.digit(t, j)) % m
        where = held_position(lv, pl, x if s == 0 else lv.with_digit(x, j, lv.digit(t, j)), t)
        return start + (s * lv.kept(j) + where) * k + c
    return start + (held_position(lv, pl, x, t) * (m - 1) + step_of(lv, pl, j, d, lv.digit(dest, j))) * k + c


def tiers_index(ctx: PlanContext[ParamsT], lv: Levels, pl: Place, label: Label) -> int:
    kind = ctx.spec.kind
    if kind == Kind.ALL_GATHER:
        return ag_index(ctx, lv, pl, label, base=0)
    if kind == Kind.ALL_REDUCE and isinstance(label, TierGatherLabel):
        return ag_index(ctx, lv, pl, label, base=rs_length(lv, pl.gpus, ctx.params.chunks))
    return rs_index(ctx, lv, pl, label)
