"""Hierarchical reduce-scatter (Triton-distributed's inter-node design, swizzled twice).

For each target node t, visited a+1, a+2, ..., own node last: (1) intra-node scatter of the L
shards destined for node t (local rank l starts with peer l+1); (2) each local rank reduces the L
pieces of its shard (t, l); (3) one RDMA transfer of that node-partial to the same local rank on
node t (via the rail gateways when NICs are fewer than GPUs). (4) Finally each rank reduces its
own node's L pieces and the N-1 partials it received into the output. Every byte crosses the
network once, already reduced by L: (N-1) * S elements in all, versus L*(N-1) * S for direct.

Scatter copies run on channel c % C, reduces and RDMA sends on C + c % C, so the scatter for the
next node proceeds while the previous node's reduce and transfer are in flight (the seed's two
streams).

Op layout per rank (what `index_of` computes): per target node in visiting order, per chunk:
L-1 scatter copies, then for a remote target a reduce (if L > 1) and the send; then one final
reduce per chunk.
"""

from __future__ import annotations

from hiercoll.planner.builder import Dep, RankBuilder, avg_scale
from hiercoll.planner.context import ParamsT, PlanContext
from hiercoll.planner.hier.common import Place, Shards, other_slot
from hiercoll.planner.labels import FinalReduceLabel, Label, NodeReduceLabel, NodeSendLabel, ScatterLabel
from hiercoll.schedule import Region

SCATTER, RS_SEND, RS_RECV = "hier_scatter", "hier_rs_send", "hier_rs_recv"


def shards_of(ctx: PlanContext[ParamsT]) -> Shards:
    return Shards.of(ctx.spec, ctx.topology.gpus_per_node, ctx.params.chunks)


def scatter(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place, target: int, c: int, *,
            channel: int) -> None:
    """Copy my pieces of the shards (target, q) into local peer q's scatter slot for me."""
    sh, g = shards_of(ctx), pl.gpus
    for q in pl.local_peers():
        off, coff, cn = sh.piece(target, q, c)
        dst = sh.slot(pl.at(pl.node, q), SCATTER, target * (g - 1) + other_slot(q, pl.local_rank, g),
                      coff, cn)
        b.copy(ctx.input(pl.rank, off + coff, cn), dst, channel=channel,
               label=ScatterLabel(target, c, q))


def node_pieces(ctx: PlanContext[ParamsT], pl: Place, target: int,
                c: int) -> tuple[list[Region], list[Dep | int]]:
    """The L pieces of shard (target, my local rank) chunk c held on my node after the scatter:
    my own input and one scatter slot per local peer, with the deps that make them ready."""
    sh, g, lr = shards_of(ctx), pl.gpus, pl.local_rank
    off, coff, cn = sh.piece(target, lr, c)
    srcs = [ctx.input(pl.rank, off + coff, cn)]
    deps: list[Dep | int] = []
    for p in range(g):
        if p != lr:
            srcs.append(sh.slot(pl.rank, SCATTER, target * (g - 1) + other_slot(lr, p, g), coff, cn))
            deps.append(Dep(pl.at(pl.node, p), ScatterLabel(target, c, lr)))
    return srcs, deps


def rail_slot(pl: Place, mine: int, other: int) -> int:
    """Slot of (my client index, node `other` relative to node `mine`) in a gateway buffer."""
    return pl.client_index(pl.local_rank) * (pl.num_nodes - 1) + other_slot(mine, other, pl.num_nodes)


def alloc(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place, names: tuple[str, ...]) -> None:
    """Gateway buffers with one shard slot per (client, remote node)."""
    if pl.num_nodes > 1 and pl.is_gateway:
        size = len(pl.clients(pl.local_rank)) * (pl.num_nodes - 1) * shards_of(ctx).width
        for name in names:
            b.alloc(name, size)


def build_reduce_scatter(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place,
                         at_shard_offset: bool) -> list[int]:
    """Emit the whole reduce-scatter; returns the final reduce's index per chunk. The result
    lands at the shard's offset of the output when `at_shard_offset` (all-reduce), else at 0."""
    k, ch, g, n = ctx.params.chunks, ctx.params.channels, pl.gpus, pl.num_nodes
    sh, lr, a = shards_of(ctx), pl.local_rank, pl.node
    gw = pl.gateway_of(lr)
    if g > 1:
        b.alloc(SCATTER, n * (g - 1) * sh.width)
    alloc(ctx, b, pl, (RS_SEND, RS_RECV))
    for t in pl.target_nodes():
        for c in range(k):
            if g > 1:
                scatter(ctx, b, pl, t, c, channel=c % ch)
            if t == a:
                continue
            srcs, deps = node_pieces(ctx, pl, t, c)
            _, coff, cn = sh.piece(t, lr, c)
            src = srcs[0]
            xdeps: list[Dep | int] = []
            if g > 1:
                src = sh.slot(pl.at(a, gw), RS_SEND, rail_slot(pl, a, t), coff, cn)
                xdeps = [b.reduce(srcs, src, channel=ch + c % ch, deps=deps,
                                  label=NodeReduceLabel(t, c))]
            dst = sh.slot(pl.at(t, gw), RS_RECV, rail_slot(pl, t, a), coff, cn)
            b.copy(src, dst, channel=ch + c % ch, deps=xdeps, label=NodeSendLabel(t, c))
    return [_final(ctx, b, pl, c, at_shard_offset) for c in range(k)]


def _final(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place, c: int, at_shard_offset: bool) -> int:
    """Own node's L pieces plus the N-1 node-partials received (on my gateway) -> output."""
    sh, a, lr, ch = shards_of(ctx), pl.node, pl.local_rank, ctx.params.channels
    srcs, deps = node_pieces(ctx, pl, a, c)
    off, coff, cn = sh.piece(a, lr, c)
    gw_rank = pl.at(a, pl.gateway_of(lr))
    for src_node in pl.source_nodes():
        srcs.append(sh.slot(gw_rank, RS_RECV, rail_slot(pl, a, src_node), coff, cn))
        deps.append(Dep(pl.at(src_node, lr), NodeSendLabel(a, c)))
    out = ctx.output(pl.rank, (off if at_shard_offset else 0) + coff, cn)
    return b.reduce(srcs, out, scale=avg_scale(ctx.spec, ctx.world), channel=ch + c % ch,
                    deps=deps, label=FinalReduceLabel(c))


def rs_length(ctx: PlanContext[ParamsT]) -> int:
    """Number of ops the reduce-scatter emits on every rank."""
    k, g, n = ctx.params.chunks, ctx.topology.gpus_per_node, ctx.topology.num_nodes
    return k * ((n - 1) * (g - 1 + _remote_extra(g)) + (g - 1)) + k


def _remote_extra(gpus: int) -> int:
    return 2 if gpus > 1 else 1   # reduce (only with local peers) + send


def rs_index(ctx: PlanContext[ParamsT], pl: Place, label: Label) -> int:
    """Index of a reduce-scatter label on `pl.rank`, by formula (mirrors the loops above)."""
    k, g = ctx.params.chunks, pl.gpus
    if isinstance(label, FinalReduceLabel):
        return rs_length(ctx) - k + label.chunk
    if not isinstance(label, ScatterLabel | NodeReduceLabel | NodeSendLabel):
        raise KeyError(label)
    t, c = label.target, label.chunk
    extra = _remote_extra(g)
    pos = pl.target_position(t)
    own_before = 0 if pl.node_swizzle else int(pl.node < t)
    start = pos * k * (g - 1 + extra) - own_before * k * extra
    base = start + c * (g - 1 + (extra if t != pl.node else 0))
    if isinstance(label, ScatterLabel):
        return base + pl.peer_position(label.peer)
    if isinstance(label, NodeReduceLabel):
        return base + g - 1
    return base + g - 1 + extra - 1
