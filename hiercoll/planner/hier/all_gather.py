"""Hierarchical all-gather, the mirror of the hierarchical reduce-scatter.

Each rank (a, l) sends its shard once over RDMA to the same local rank on every other node (in
node-swizzled order), and distributes it over NVLink to its L-1 local peers. When a remote shard
(b, l) arrives it is forwarded over NVLink to the node's other local ranks. Network traffic:
(N-1) * S elements, versus L*(N-1) * S for the direct all-gather. With fewer NICs the shard is
staged to the gateway GPU first, crosses between gateways, and is distributed from the far
gateway's receive slot to all L local ranks.

Channels: prologue and sends on c % C, distribution of received shards on C + c % C.
Op layout per rank, for `index_of`: per chunk a prologue (own copy for all_gather, the staging
copy when staged, L-1 local distributions), then per remote target per chunk one send, then per
source node per chunk L-1 (or L when staged) distributions.
"""

from __future__ import annotations

from collections.abc import Sequence

from hiercoll.collectives import Kind
from hiercoll.planner.builder import Dep, RankBuilder
from hiercoll.planner.context import ParamsT, PlanContext
from hiercoll.planner.hier.common import Place
from hiercoll.planner.hier.reduce_scatter import alloc, rail_slot, shards_of
from hiercoll.planner.labels import (
    GatherDistributeLabel,
    GatherOwnLabel,
    GatherSendLabel,
    GatherStageLabel,
    Label,
)
from hiercoll.schedule import Region

AG_STAGE, AG_RECV = "hier_ag_stage", "hier_ag_recv"


def build_all_gather(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place, ready: Sequence[int] = ()) -> None:
    """Emit the all-gather. For all_reduce, the shard is already in the output at its offset and
    `ready[c]` is the index of the op that finished chunk c there; for all_gather it is the input."""
    k, ch, a, lr = ctx.params.chunks, ctx.params.channels, pl.node, pl.local_rank
    sh = shards_of(ctx)
    gw = pl.gateway_of(lr)
    gathering = ctx.spec.kind == Kind.ALL_GATHER
    alloc(ctx, b, pl, (AG_RECV,))
    if pl.num_nodes > 1 and pl.is_gateway:
        b.alloc(AG_STAGE, len(pl.clients(lr)) * sh.width)
    sources: list[tuple[Region, list[Dep | int]]] = []
    for c in range(k):
        off, coff, cn = sh.piece(a, lr, c)
        src = ctx.input(pl.rank, coff, cn) if gathering else ctx.output(pl.rank, off + coff, cn)
        deps: list[Dep | int] = [] if gathering else [ready[c]]
        if gathering:
            b.copy(src, ctx.output(pl.rank, off + coff, cn), channel=c % ch,
                   label=GatherOwnLabel(c))
        send_src, send_deps = src, deps
        if pl.staged:
            send_src = Region(pl.at(a, gw), AG_STAGE, pl.client_index(lr) * sh.width + coff, cn)
            send_deps = [b.copy(src, send_src, channel=c % ch, deps=deps,
                                label=GatherStageLabel(c))]
        sources.append((send_src, send_deps))
        for q in pl.local_peers():
            b.copy(src, ctx.output(pl.at(a, q), off + coff, cn), channel=ch + c % ch, deps=deps,
                   label=GatherDistributeLabel(a, c, q))
    for t in pl.target_nodes(include_own=False):
        for c in range(k):
            off, coff, cn = sh.piece(a, lr, c)
            if gw == lr:
                dst = ctx.output(pl.at(t, lr), off + coff, cn)
            else:
                dst = sh.slot(pl.at(t, gw), AG_RECV, rail_slot(pl, t, a), coff, cn)
            b.copy(sources[c][0], dst, channel=c % ch, deps=sources[c][1],
                   label=GatherSendLabel(t, c))
    for src_node in pl.source_nodes():
        for c in range(k):
            _distribute(ctx, b, pl, src_node, c)


def _distribute(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place, src_node: int, c: int) -> None:
    """Forward shard (src_node, l) chunk c from where it landed to the node's other GPUs."""
    sh, a, lr, ch = shards_of(ctx), pl.node, pl.local_rank, ctx.params.channels
    off, coff, cn = sh.piece(src_node, lr, c)
    if pl.staged:
        landed = sh.slot(pl.at(a, pl.gateway_of(lr)), AG_RECV, rail_slot(pl, a, src_node), coff, cn)
    else:
        landed = ctx.output(pl.rank, off + coff, cn)
    for q in pl.local_peers(include_self=pl.staged):
        b.copy(landed, ctx.output(pl.at(a, q), off + coff, cn), channel=ch + c % ch,
               deps=[Dep(pl.at(src_node, lr), GatherSendLabel(a, c))],
               label=GatherDistributeLabel(src_node, c, q))


def ag_index(ctx: PlanContext[ParamsT], pl: Place, label: Label, base: int) -> int:
    """Index of an all-gather send label GatherSendLabel(t, c) on `pl.rank`, by formula; `base`
    is the number of ops emitted before the all-gather (the reduce-scatter's, for all_reduce)."""
    if not isinstance(label, GatherSendLabel):
        raise KeyError(label)
    k = ctx.params.chunks
    prologue = int(ctx.spec.kind == Kind.ALL_GATHER) + int(pl.staged) + pl.gpus - 1
    return base + k * prologue + pl.target_position(label.target, include_own=False) * k + label.chunk
