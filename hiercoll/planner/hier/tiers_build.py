"""`hier_tiers`' reduce-scatter and all-gather over k scale-out levels (hier/levels.py).

Reduce-scatter, rank (a, l): (0) the intra-node scatter of `hier` (hier/reduce_scatter.py): local
peer q gets my pieces of shards (t, q) for every node t. Then each shard (t, l) travels along the
rail of local rank l, up the levels: at level j every rank sends the partials of the shards
whose digits below j match its own and whose digit j does not to its level-j group, and keeps
those whose digit j matches. `inner=direct` sends each straight to the peer that differs from it
only in digit j (t's digit j); `inner=ring` passes them round the group's ring in m_j - 1 steps,
each rank folding in what the previous one passed (as `ring` does among all ranks).
So a shard leaves a at the lowest level where t's position differs from a's (`first_difference`),
already reduced over a's node and every level below; it crosses each tier once, and a level-j
tier carries 1/(m_1 ... m_(j-1)) of what the leaf does. A partial is never written down between
levels: the send reduces the L node pieces plus the m_i - 1 partials received at each level i
below (one per level with a ring) into one send slot (one read of everything that went into it),
and the final reduce does the same for my own shard. One level exchanged directly is `hier`'s
reduce-scatter (which `hier_tiers` calls then).

All-gather, the mirror: from the top level down, a rank sends every shard it holds (its own,
then those received at higher levels, in the order they arrive: `held_key`) to its m_j - 1
level-j peers (or round the ring), straight into their outputs; each shard arriving is forwarded
over NVLink to the node's other GPUs, in arrival order.

Channels as `hier`: scatter copies and all-gather sends on c % C, reduces, reduce-scatter sends
and all-gather forwards on C + c % C. Order per rank: reduce-scatter targets by the level they
leave at, then their relative digits (swizzled: every step of a level is a permutation), own
shard last. Peers' labels resolve by formula (tiers_index.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from hiercoll.collectives import Kind
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale
from hiercoll.planner.context import ParamsT, PlanContext
from hiercoll.planner.hier.common import Place, other_slot
from hiercoll.planner.hier.levels import Levels
from hiercoll.planner.hier.reduce_scatter import SCATTER, node_pieces, scatter, shards_of
from hiercoll.planner.labels import FinalReduceLabel, TierGatherLabel, TierSendLabel
from hiercoll.schedule import Region

RECV, SEND = "tiers_rs_recv", "tiers_rs_send"


def level_slots(lv: Levels, j: int) -> int:
    """Receive slots of level j: direct, one per (peer, shard kept there); ring, one per shard
    that passes through (those whose digits below j match mine)."""
    if lv.is_ring(j):
        return lv.num_nodes // lv.strides[j]
    return (lv.radices[j] - 1) * lv.kept(j)


def recv_slot(lv: Levels, j: int, mine: int, sender: int, target: int) -> int:
    """Slot of the partial of `target`'s shard that the level-j peer at digit `sender` sends
    to the rank at digit `mine`."""
    base = sum(level_slots(lv, i) for i in range(j))
    if lv.is_ring(j):
        return base + target // lv.strides[j]
    return base + other_slot(mine, sender, lv.radices[j]) * lv.kept(j) + lv.above(target, j)


def recv_slots(lv: Levels) -> int:
    return sum(level_slots(lv, j) for j in range(lv.count))


def ring_step(lv: Levels, node: int, j: int, target: int) -> int:
    """Reduce-scatter ring at level j: the step at which `node` passes `target`'s partial on
    (the rank after the target's digit starts, step 0; the one before it ends, m_j - 2)."""
    return (lv.digit(node, j) - lv.digit(target, j) - 1) % lv.radices[j]


def ring_neighbour(lv: Levels, pl: Place, j: int, step: int) -> int:
    """My level-j ring neighbour's rank: next (step 1) or previous (step -1)."""
    d = (lv.digit(pl.node, j) + step) % lv.radices[j]
    return pl.at(lv.with_digit(pl.node, j, d), pl.local_rank)


def relative(lv: Levels, pl: Place, node: int, j: int) -> int:
    """Digit j of `node` as seen from my node (swizzled: +1 first), or absolute."""
    d = lv.digit(node, j)
    return (d - lv.digit(pl.node, j)) % lv.radices[j] if pl.node_swizzle else d


def target_order(lv: Levels, pl: Place) -> list[int]:
    """Nodes by the level their shard leaves me at, then their relative digits from that level
    up; my own node last."""
    def key(t: int) -> tuple[int, ...]:
        s = lv.first_difference(pl.node, t)
        if s < lv.count and lv.is_ring(s):      # a ring's steps in order
            return (s, ring_step(lv, pl.node, s, t), *(relative(lv, pl, t, j) for j in range(s + 1, lv.count)))
        return (s, *(relative(lv, pl, t, j) for j in range(s, lv.count)))
    return sorted(range(lv.num_nodes), key=key)


def level_peers(lv: Levels, pl: Place, j: int) -> list[int]:
    """Digits of my level-j peers in visiting order (mine + 1, mine + 2, ... when swizzled)."""
    m, d = lv.radices[j], lv.digit(pl.node, j)
    if pl.node_swizzle:
        return [(d + i) % m for i in range(1, m)]
    return [v for v in range(m) if v != d]


def step_of(lv: Levels, pl: Place, j: int, sender: int, receiver: int) -> int:
    """Index of digit `receiver` in the level-j visiting order of digit `sender`."""
    if pl.node_swizzle:
        return other_slot(sender, receiver, lv.radices[j])
    return receiver if receiver < sender else receiver - 1


def arrival_index(lv: Levels, pl: Place, j: int, sender: int, receiver: int) -> int:
    """Tells apart the m_j - 1 level-j senders of shards at one place of their held lists:
    the step at which `sender` reaches `receiver` (swizzled: a different step for each), or,
    with plain orders (several senders reach it at once), the sender's digit among the others."""
    if pl.node_swizzle:
        return step_of(lv, pl, j, sender, receiver)
    return step_of(lv, pl, j, receiver, sender)


def held_key(lv: Levels, pl: Place, node: int, t: int) -> tuple[int, ...]:
    """All-gather: where shard t stands among those `node` holds, in the order they arrive (and
    are sent on and forwarded): its own first, then by level (the top first), then the place t
    held on its sender, then the step the sender reached `node` at."""
    if t == node:
        return (0,)
    j = lv.first_difference(node, t)
    d = lv.digit(t, j)
    owner = held_key(lv, pl, lv.with_digit(node, j, d), t)
    if lv.is_ring(j):      # block d passes round the ring in its owner's order
        return (lv.count - j, (lv.digit(node, j) - 1 - d) % lv.radices[j], *owner)
    return (lv.count - j, *owner, arrival_index(lv, pl, j, d, lv.digit(node, j)))


def partial(ctx: PlanContext[ParamsT], lv: Levels, pl: Place, target: int,
            c: int) -> tuple[list[Region], list[Dep | int]]:
    """Everything that sums into my partial of shard (target, l) chunk c, with its deps: my
    node's L pieces and, at each level below the one it leaves at, the m_j - 1 partials received."""
    sh, lr = shards_of(ctx), pl.local_rank
    srcs, deps = node_pieces(ctx, pl, target, c)
    _, coff, cn = sh.piece(target, lr, c)
    for j in range(lv.first_difference(pl.node, target)):
        d = lv.digit(pl.node, j)
        if lv.is_ring(j):    # my own block: the partial the ring's last step brought
            srcs.append(sh.slot(pl.rank, RECV, recv_slot(lv, j, d, d - 1, target), coff, cn))
            deps.append(Dep(ring_neighbour(lv, pl, j, -1), TierSendLabel(target, c)))
            continue
        for v in level_peers(lv, pl, j):
            srcs.append(sh.slot(pl.rank, RECV, recv_slot(lv, j, d, v, target), coff, cn))
            deps.append(Dep(pl.at(lv.with_digit(pl.node, j, v), lr), TierSendLabel(target, c)))
    return srcs, deps


def _send(ctx: PlanContext[ParamsT], b: RankBuilder, lv: Levels, pl: Place, target: int, c: int) -> None:
    """Reduce my partial of (target, l) chunk c and send it one level up."""
    sh, lr, ch = shards_of(ctx), pl.local_rank, ctx.params.channels
    j = lv.first_difference(pl.node, target)
    srcs, deps = partial(ctx, lv, pl, target, c)
    _, coff, cn = sh.piece(target, lr, c)
    mine = lv.digit(pl.node, j)
    if lv.is_ring(j):
        if ring_step(lv, pl.node, j, target):       # fold in what the previous rank passed on
            srcs.append(sh.slot(pl.rank, RECV, recv_slot(lv, j, mine, mine - 1, target), coff, cn))
            deps.append(Dep(ring_neighbour(lv, pl, j, -1), TierSendLabel(target, c)))
        to = (mine + 1) % lv.radices[j]
    else:
        to = lv.digit(target, j)
    src, xdeps = srcs[0], deps
    if len(srcs) > 1:
        src = sh.slot(pl.rank, SEND, target, coff, cn)
        xdeps = [b.reduce(srcs, src, channel=ch + c % ch, deps=deps)]
    dst = sh.slot(pl.at(lv.with_digit(pl.node, j, to), lr), RECV, recv_slot(lv, j, to, mine, target),
                  coff, cn)
    b.copy(src, dst, channel=ch + c % ch, deps=xdeps, label=TierSendLabel(target, c))


def build_reduce_scatter(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place, lv: Levels,
                         at_shard_offset: bool) -> list[int]:
    """Emit the reduce-scatter; returns the final reduce's index per chunk (the result at the
    shard's offset of the output when `at_shard_offset`, else at 0)."""
    k, ch, g, n = ctx.params.chunks, ctx.params.channels, pl.gpus, pl.num_nodes
    sh, a = shards_of(ctx), pl.node
    if g > 1:
        b.alloc(SCATTER, n * (g - 1) * sh.width)
    b.alloc(SEND, n * sh.width)     # a slot per target (L = 1 at the leaf sends the input itself)
    b.alloc(RECV, recv_slots(lv) * sh.width)
    order = target_order(lv, pl)
    for t in order:
        for c in range(k):
            if g > 1:
                scatter(ctx, b, pl, t, c, channel=c % ch)
            if t != a and lv.first_difference(a, t) == 0:
                _send(ctx, b, lv, pl, t, c)
    for t in order:
        if t != a and lv.first_difference(a, t) > 0:
            for c in range(k):
                _send(ctx, b, lv, pl, t, c)
    fins = []
    for c in range(k):
        srcs, deps = partial(ctx, lv, pl, a, c)
        off, coff, cn = sh.piece(a, pl.local_rank, c)
        out = ctx.output(pl.rank, (off if at_shard_offset else 0) + coff, cn)
        fins.append(b.reduce(srcs, out, scale=avg_scale(ctx.spec, ctx.world), channel=ch + c % ch,
                             deps=deps, label=FinalReduceLabel(c)))
    return fins


def build_all_gather(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place, lv: Levels,
                     ready: Sequence[int] = ()) -> None:
    """Emit the all-gather. all_reduce: my shard is in the output at its offset once op
    `ready[c]` ran; all_gather: it is the input."""
    k, ch, a, lr = ctx.params.chunks, ctx.params.channels, pl.node, pl.local_rank
    sh = shards_of(ctx)
    gathering = ctx.spec.kind == Kind.ALL_GATHER

    def source(t: int, c: int) -> tuple[Region, list[Dep | int]]:
        off, coff, cn = sh.piece(t, lr, c)
        if t == a:
            if gathering:
                return ctx.input(pl.rank, coff, cn), []
            return ctx.output(pl.rank, off + coff, cn), [ready[c]]
        j = lv.first_difference(a, t)
        sender = (ring_neighbour(lv, pl, j, -1) if lv.is_ring(j)
                  else pl.at(lv.with_digit(a, j, lv.digit(t, j)), lr))
        return ctx.output(pl.rank, off + coff, cn), [Dep(sender, TierGatherLabel(a, t, c))]

    def send(t: int, dest: int) -> None:
        for c in range(k):
            off, coff, cn = sh.piece(t, lr, c)
            src, deps = source(t, c)
            b.copy(src, ctx.output(pl.at(dest, lr), off + coff, cn), channel=c % ch,
                   deps=deps, label=TierGatherLabel(dest, t, c))

    def forward(t: int) -> None:
        for c in range(k):
            off, coff, cn = sh.piece(t, lr, c)
            src, deps = source(t, c)
            for q in pl.local_peers():
                b.copy(src, ctx.output(pl.at(a, q), off + coff, cn), channel=ch + c % ch, deps=deps)

    if gathering:
        for c in range(k):
            off, coff, cn = sh.piece(a, lr, c)
            b.copy(ctx.input(pl.rank, coff, cn), ctx.output(pl.rank, off + coff, cn), channel=c % ch)
    forward(a)
    held = [a]
    for j in reversed(range(lv.count)):
        arrivals = sorted((t for t in range(lv.num_nodes) if t != a and lv.first_difference(a, t) == j),
                          key=lambda t: held_key(lv, pl, a, t))
        if lv.is_ring(j):
            # step s passes block d - s (mine at step 0, then what the previous rank passed)
            m, d = lv.radices[j], lv.digit(a, j)
            nxt = lv.with_digit(a, j, (d + 1) % m)
            for step in range(m - 1):
                block = held if step == 0 else [t for t in arrivals if lv.digit(t, j) == (d - step) % m]
                for t in block:
                    send(t, nxt)
        else:
            for t in held:
                for v in level_peers(lv, pl, j):
                    send(t, lv.with_digit(a, j, v))
        held += arrivals
    for t in held[1:]:
        forward(t)
