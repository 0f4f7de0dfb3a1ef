"""Rail-aggregated all_to_all (the hierarchical all-to-all of DeepEP / PXN style).

Blocks for the GPUs of one remote node are contiguous in the input (ranks t*L .. t*L+L-1), so
each rank sends them as ONE aggregated transfer per destination node, over its rail: to the
gateway with its (gateway's) local rank on node t, which forwards each block over NVLink to its
destination. Blocks for the own node go directly over NVLink. Network elements are those of
the direct all_to_all ((N-1)/N of every rank's buffer; all-to-all has nothing to de-duplicate),
but in N-1 messages per rank instead of (N-1)*L, all on the rank's own rail.

With one GPU per node the relay is the destination itself, so the transfer lands in the output.
Sends on channel c % C, forwards on C + c % C.
"""

from __future__ import annotations

from hiercoll.planner.builder import Dep, RankBuilder, chunk_bounds
from hiercoll.planner.context import ParamsT, PlanContext
from hiercoll.planner.hier.common import Place, other_slot
from hiercoll.planner.labels import A2ASendLabel, Label
from hiercoll.schedule import Region

A2A_STAGE, A2A_RELAY = "hier_a2a_stage", "hier_a2a_relay"


def _slot(pl: Place, local_rank: int, mine: int, other: int, span: int) -> int:
    """Offset of (client `local_rank`, node `other` relative to `mine`) in a gateway buffer."""
    return (pl.client_index(local_rank) * (pl.num_nodes - 1) + other_slot(mine, other, pl.num_nodes)) * span


def build_all_to_all(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place) -> None:
    k, ch, r, a, g = ctx.params.chunks, ctx.params.channels, pl.rank, pl.node, pl.gpus
    blk = ctx.spec.count // ctx.world
    span, gw = g * blk, pl.gateway_of(pl.local_rank)
    if pl.num_nodes > 1 and pl.is_gateway and g > 1:
        size = len(pl.clients(pl.local_rank)) * (pl.num_nodes - 1) * span
        b.alloc(A2A_STAGE, size)
        b.alloc(A2A_RELAY, size)
    for c in range(k):
        lo, n = chunk_bounds(blk, k, c)
        for q in pl.local_peers(include_self=True):
            b.copy(ctx.input(r, (a * g + q) * blk + lo, n), ctx.output(pl.at(a, q), r * blk + lo, n),
                   channel=c % ch)
    for t in pl.target_nodes(include_own=False):
        for c in range(k):
            lo, n = chunk_bounds(span, k, c)
            src = ctx.input(r, t * span + lo, n)
            deps: list[Dep | int] = []
            if g == 1:
                dst = ctx.output(pl.at(t, 0), r * blk + lo, n)
            else:
                dst = Region(pl.at(t, gw), A2A_RELAY, _slot(pl, pl.local_rank, t, a, span) + lo, n)
            if pl.staged:
                staged = Region(pl.at(a, gw), A2A_STAGE, _slot(pl, pl.local_rank, a, t, span) + lo, n)
                deps = [b.copy(src, staged, channel=c % ch)]
                src = staged
            b.copy(src, dst, channel=c % ch, deps=deps, label=A2ASendLabel(t, c))
    if pl.num_nodes > 1 and pl.is_gateway and g > 1:
        _forward(ctx, b, pl, blk)


def _forward(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place, blk: int) -> None:
    """As a gateway: split each relayed aggregate into its per-destination blocks."""
    k, ch, a, g = ctx.params.chunks, ctx.params.channels, pl.node, pl.gpus
    span = g * blk
    for src_node in pl.source_nodes():
        for x in pl.clients(pl.local_rank):
            s = pl.at(src_node, x)
            base = _slot(pl, x, a, src_node, span)
            for c in range(k):
                lo, n = chunk_bounds(span, k, c)
                for q in pl.local_peers(include_self=True):
                    start, end = max(lo, q * blk), min(lo + n, (q + 1) * blk)
                    if start >= end:
                        continue
                    b.copy(Region(pl.rank, A2A_RELAY, base + start, end - start),
                           ctx.output(pl.at(a, q), s * blk + start - q * blk, end - start),
                           channel=ch + c % ch, deps=[Dep(s, A2ASendLabel(a, c))])


def a2a_index(ctx: PlanContext[ParamsT], pl: Place, label: Label) -> int:
    """Index of a send A2ASendLabel(t, c), by formula: per chunk L local copies, then per remote
    node per chunk the staging copy (when staged) and the send."""
    if not isinstance(label, A2ASendLabel):
        raise KeyError(label)
    k, per = ctx.params.chunks, 1 + int(pl.staged)
    send = pl.target_position(label.target, include_own=False) * k + label.chunk
    return k * pl.gpus + send * per + per - 1
