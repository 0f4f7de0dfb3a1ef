"""`hier_2d`: the classic two-level schedule, phase by phase.

all_reduce: (1) intra-node reduce-scatter: local rank l ends with the node-partial of the N
shards (t, l), t = 0..N-1; (2) an all-reduce of those N shards among the rail (the ranks with
local rank l on every node) over RDMA, `inter` = ring (reduce-scatter + all-gather around the
rail: 2(N-1)/N of the rail block per rank, one neighbour per step) or direct (one-shot: every
rank sends its whole block to every rail peer and reduces what it receives: (N-1) blocks per
rank, one step; every rail rank sums the N node-partials in node order, so all get the same
bits); (3) intra-node all-gather of the N finished shards. reduce_scatter is (1) plus
the inter-node reduce-scatter half of (2); all_gather is the all-gather half of (2) plus (3).

Unlike `hier`, the phases are not interleaved per target node, and inter-node transfers leave
from each GPU directly (its nearest NIC: the topology's `nic_of_local_rank`), not via gateways.
Scatter and intra-node all-gather copies run on channel c % C, reduces and RDMA on C + c % C.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale
from hiercoll.planner.context import Algorithm, PlanContext, node_period
from hiercoll.planner.hier.common import Place, SwizzleParams, hier_peers, other_slot
from hiercoll.planner.hier.reduce_scatter import SCATTER, node_pieces, scatter, shards_of
from hiercoll.planner.labels import (
    FinalReduceLabel,
    Label,
    RailAgLabel,
    RailOneShotLabel,
    RailRsLabel,
    ScatterLabel,
)
from hiercoll.schedule import Region
from hiercoll.topology import Topology

PART, RECV = "hier2d_part", "hier2d_recv"


class InterAlgo(StrEnum):
    RING = "ring"
    DIRECT = "direct"


class Hier2DParams(SwizzleParams):
    inter: InterAlgo = Field(default=InterAlgo.RING, description="inter-node all-reduce/"
                             "reduce-scatter/all-gather among the rail: ring or direct (one-shot)")


Ready = dict[tuple[int, int], list[Dep | int]]   # (shard node, chunk) -> deps making it ready


Ctx = PlanContext[Hier2DParams]


class Hier2D(Algorithm[Hier2DParams]):
    name = "hier_2d"
    kinds = frozenset({Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE})
    Params = Hier2DParams

    def peers_per_rank(self, topology: Topology, spec: CollectiveSpec, params: Hier2DParams) -> int:
        if spec.kind == Kind.ALL_REDUCE and params.inter == InterAlgo.DIRECT:
            # one-shot across nodes: each rank pushes all N node-partials to every rail peer,
            # N x (N - 1) copies (W = 4096: ~270k ops a rank, not the ~9k of the other phases)
            return hier_peers(topology) + topology.num_nodes ** 2
        return hier_peers(topology)

    def symmetry_period(self, ctx: Ctx) -> int | None:
        p = ctx.params
        return node_period(ctx, p.node_swizzle, p.rank_swizzle)

    def build_rank(self, ctx: Ctx, b: RankBuilder) -> None:
        pl, kind = Place.of(ctx, b.rank), ctx.spec.kind
        ready: Ready = {}
        if kind != Kind.ALL_GATHER:
            parts = _intra_reduce_scatter(ctx, b, pl)
            if pl.num_nodes == 1:
                ready = _finish_single_node(ctx, b, pl, parts)
            elif kind == Kind.ALL_REDUCE and ctx.params.inter == InterAlgo.DIRECT:
                ready = _one_shot(ctx, b, pl, parts)
            else:
                fins = _inter_reduce_scatter(ctx, b, pl, parts)
                ready = {(pl.node, c): [i] for c, i in enumerate(fins)}
        if kind != Kind.REDUCE_SCATTER:
            if kind == Kind.ALL_GATHER or (pl.num_nodes > 1 and ctx.params.inter == InterAlgo.RING):
                ready |= _inter_all_gather(ctx, b, pl, ready)
            _intra_all_gather(ctx, b, pl, ready)

    def index_of(self, ctx: Ctx, rank: int, label: Label) -> int:
        return hier2d_index(ctx, Place.of(ctx, rank), label)


def _part(ctx: Ctx, pl: Place, node: int, c: int) -> Region:
    """Where the node-partial of shard (node, my local rank) chunk c lives after phase 1."""
    sh = shards_of(ctx)
    off, coff, cn = sh.piece(node, pl.local_rank, c)
    if pl.gpus == 1:
        return ctx.input(pl.rank, off + coff, cn)
    return sh.slot(pl.rank, PART, node, coff, cn)


def _intra_reduce_scatter(ctx: Ctx, b: RankBuilder, pl: Place) -> Ready:
    """Phase 1: node-partials of my N shards (kept in PART; the input itself when L = 1)."""
    k, ch, g = ctx.params.chunks, ctx.params.channels, pl.gpus
    sh = shards_of(ctx)
    parts: Ready = {}
    if g == 1:
        return {(t, c): [] for t in range(pl.num_nodes) for c in range(k)}
    b.alloc(SCATTER, pl.num_nodes * (g - 1) * sh.width)
    if pl.num_nodes > 1:
        b.alloc(PART, pl.num_nodes * sh.width)
    for t in pl.target_nodes():
        for c in range(k):
            scatter(ctx, b, pl, t, c, channel=c % ch)
            if pl.num_nodes > 1:
                srcs, deps = node_pieces(ctx, pl, t, c)
                parts[(t, c)] = [b.reduce(srcs, _part(ctx, pl, t, c), channel=ch + c % ch, deps=deps)]
    return parts


def _finish_single_node(ctx: Ctx, b: RankBuilder, pl: Place, parts: Ready) -> Ready:
    """N = 1: the intra-node reduce is the final one; it writes the output directly."""
    k, ch, sh = ctx.params.chunks, ctx.params.channels, shards_of(ctx)
    shift = ctx.spec.kind == Kind.ALL_REDUCE
    ready: Ready = {}
    for c in range(k):
        off, coff, cn = sh.piece(0, pl.local_rank, c)
        srcs, deps = node_pieces(ctx, pl, 0, c)
        ready[(0, c)] = [b.reduce(srcs, ctx.output(pl.rank, (off if shift else 0) + coff, cn),
                                  scale=avg_scale(ctx.spec, ctx.world), channel=ch + c % ch,
                                  deps=deps, label=FinalReduceLabel(c))]
    return ready


def _rail(pl: Place, step: int) -> int:
    return pl.at((pl.node + step) % pl.num_nodes, pl.local_rank)


def _inter_reduce_scatter(ctx: Ctx, b: RankBuilder, pl: Place, parts: Ready) -> list[int]:
    """Phase 2a: reduce-scatter of the N node-partials along the rail; shard (a, l) ends in the
    output (at its offset for all_reduce). Returns the final reduce's index per chunk."""
    k, ch, n, sh = ctx.params.chunks, ctx.params.channels, pl.num_nodes, shards_of(ctx)
    ring = ctx.params.inter == InterAlgo.RING
    b.alloc(RECV, (n - 1) * sh.width)
    for c in range(k):
        if ring:
            _ring_rs_steps(ctx, b, pl, parts, c)
            continue
        for t in pl.target_nodes(include_own=False):
            off, coff, cn = sh.piece(t, pl.local_rank, c)
            b.copy(_part(ctx, pl, t, c), sh.slot(pl.at(t, pl.local_rank), RECV, other_slot(t, pl.node, n),
                   coff, cn), channel=ch + c % ch, deps=parts[(t, c)], label=RailRsLabel(t, c))
    fins = []
    for c in range(k):
        off, coff, cn = sh.piece(pl.node, pl.local_rank, c)
        srcs, deps = [_part(ctx, pl, pl.node, c)], list(parts[(pl.node, c)])
        if ring:
            srcs.append(sh.slot(pl.rank, RECV, n - 2, coff, cn))
            deps.append(Dep(_rail(pl, -1), RailRsLabel(n - 2, c)))
        else:
            srcs += [sh.slot(pl.rank, RECV, other_slot(pl.node, m, n), coff, cn) for m in pl.source_nodes()]
            deps += [Dep(pl.at(m, pl.local_rank), RailRsLabel(pl.node, c)) for m in pl.source_nodes()]
        shift = off if ctx.spec.kind == Kind.ALL_REDUCE else 0
        fins.append(b.reduce(srcs, ctx.output(pl.rank, shift + coff, cn), channel=ch + c % ch,
                             scale=avg_scale(ctx.spec, ctx.world), deps=deps,
                             label=FinalReduceLabel(c)))
    return fins


def _ring_rs_steps(ctx: Ctx, b: RankBuilder, pl: Place, parts: Ready, c: int) -> None:
    """Step s: fold what arrived at step s-1 into my partial of shard (a-s-1) and pass it on."""
    ch, n, sh, a = ctx.params.channels, pl.num_nodes, shards_of(ctx), pl.node
    nxt = _rail(pl, 1)
    for s in range(n - 1):
        piece = (a - s - 1) % n
        _, coff, cn = sh.piece(piece, pl.local_rank, c)
        dst = sh.slot(nxt, RECV, s, coff, cn)
        deps = list(parts[(piece, c)])
        srcs = [_part(ctx, pl, piece, c)]
        if s:
            srcs.append(sh.slot(pl.rank, RECV, s - 1, coff, cn))
            deps.append(Dep(_rail(pl, -1), RailRsLabel(s - 1, c)))
        b.reduce(srcs, dst, channel=ch + c % ch, deps=deps, label=RailRsLabel(s, c))


def _one_shot(ctx: Ctx, b: RankBuilder, pl: Place, parts: Ready) -> Ready:
    """Phase 2 for all_reduce with inter=direct: every rank pushes its N partials to every rail
    peer, then reduces all N contributions of each shard (t, l) into the output."""
    k, ch, n, sh = ctx.params.chunks, ctx.params.channels, pl.num_nodes, shards_of(ctx)
    b.alloc(RECV, (n - 1) * n * sh.width)
    for c in range(k):
        for m in pl.target_nodes(include_own=False):
            for t in range(n):
                _, coff, cn = sh.piece(t, pl.local_rank, c)
                dst = sh.slot(pl.at(m, pl.local_rank), RECV, other_slot(m, pl.node, n) * n + t, coff, cn)
                b.copy(_part(ctx, pl, t, c), dst, channel=ch + c % ch, deps=parts[(t, c)],
                       label=RailOneShotLabel(m, t, c))
    ready: Ready = {}
    for c in range(k):
        for t in range(n):
            off, coff, cn = sh.piece(t, pl.local_rank, c)
            # the N node-partials in node order on every rail rank (never "mine first"): each
            # rail rank sums shard t itself, so one order gives them the same bits
            srcs = [_part(ctx, pl, t, c) if m == pl.node else
                    sh.slot(pl.rank, RECV, other_slot(pl.node, m, n) * n + t, coff, cn)
                    for m in range(n)]
            deps = list(parts[(t, c)]) + [Dep(pl.at(m, pl.local_rank), RailOneShotLabel(pl.node, t, c))
                                          for m in pl.source_nodes()]
            ready[(t, c)] = [b.reduce(srcs, ctx.output(pl.rank, off + coff, cn), channel=ch + c % ch,
                                      scale=avg_scale(ctx.spec, ctx.world), deps=deps)]
    return ready


def _inter_all_gather(ctx: Ctx, b: RankBuilder, pl: Place, ready: Ready) -> Ready:
    """Phase 2b: all-gather of shards (t, l) along the rail, into the outputs at shard offsets.
    Returns, per (shard node, chunk), the deps after which it is in my output."""
    k, ch, n, sh, a = ctx.params.chunks, ctx.params.channels, pl.num_nodes, shards_of(ctx), pl.node
    gathering, ring = ctx.spec.kind == Kind.ALL_GATHER, ctx.params.inter == InterAlgo.RING
    out: Ready = {}
    for c in range(k):
        off, coff, cn = sh.piece(a, pl.local_rank, c)
        if gathering:
            out[(a, c)] = [b.copy(ctx.input(pl.rank, coff, cn), ctx.output(pl.rank, off + coff, cn),
                                  channel=c % ch)]
        mine = ctx.input(pl.rank, coff, cn) if gathering else ctx.output(pl.rank, off + coff, cn)
        deps = [] if gathering else ready[(a, c)]
        if not ring:
            for m in pl.target_nodes(include_own=False):
                b.copy(mine, ctx.output(pl.at(m, pl.local_rank), off + coff, cn), channel=ch + c % ch,
                       deps=deps, label=RailAgLabel(m, c))
            out |= {(m, c): [Dep(pl.at(m, pl.local_rank), RailAgLabel(a, c))] for m in pl.source_nodes()}
            continue
        for s in range(n - 1):
            piece = (a - s) % n
            poff, pcoff, pcn = sh.piece(piece, pl.local_rank, c)
            src = mine if s == 0 else ctx.output(pl.rank, poff + pcoff, pcn)
            step_deps = deps if s == 0 else [Dep(_rail(pl, -1), RailAgLabel(s - 1, c))]
            b.copy(src, ctx.output(_rail(pl, 1), poff + pcoff, pcn), channel=ch + c % ch,
                   deps=step_deps, label=RailAgLabel(s, c))
            out[((a - s - 1) % n, c)] = [Dep(_rail(pl, -1), RailAgLabel(s, c))]
    return out


def _intra_all_gather(ctx: Ctx, b: RankBuilder, pl: Place, ready: Ready) -> None:
    """Phase 3: copy every finished shard (t, l) in my output to my local peers' outputs."""
    k, ch, sh = ctx.params.chunks, ctx.params.channels, shards_of(ctx)
    for c in range(k):
        for t in [pl.node] + pl.source_nodes():
            off, coff, cn = sh.piece(t, pl.local_rank, c)
            for q in pl.local_peers():
                b.copy(ctx.output(pl.rank, off + coff, cn), ctx.output(pl.at(pl.node, q), off + coff, cn),
                       channel=c % ch, deps=ready[(t, c)])


def hier2d_index(ctx: Ctx, pl: Place, label: Label) -> int:
    """Index of a label peers depend on, by formula (mirrors the phase loops above): phase 1 is
    per (target node, chunk) L-1 scatters and a partial reduce (N > 1); phase 2 per chunk N-1
    rail steps (or (N-1)*N one-shot sends), then the final reduces; phase 3 per chunk an own
    copy (all_gather) and N-1 rail steps."""
    k, g, n, kind = ctx.params.chunks, pl.gpus, pl.num_nodes, ctx.spec.kind
    ring = ctx.params.inter == InterAlgo.RING
    per_target = (g - 1 + int(n > 1)) if g > 1 else 0
    phase1 = n * k * per_target if kind != Kind.ALL_GATHER else 0
    if kind == Kind.ALL_GATHER:
        phase2 = 0
    elif n == 1:
        phase2 = k
    elif kind == Kind.ALL_REDUCE and not ring:
        phase2 = k * (n - 1) * n + k * n
    else:
        phase2 = k * (n - 1) + k
    if isinstance(label, ScatterLabel):
        return ((pl.target_position(label.target) * k + label.chunk) * per_target
                + pl.peer_position(label.peer))
    if isinstance(label, RailOneShotLabel):
        m, t, c = label.target, label.shard, label.chunk
        return phase1 + c * (n - 1) * n + pl.target_position(m, include_own=False) * n + t
    if not isinstance(label, RailRsLabel | RailAgLabel):
        raise KeyError(label)
    step, c = label.where, label.chunk
    where = step if ring else pl.target_position(step, include_own=False)
    if isinstance(label, RailRsLabel):
        return phase1 + c * (n - 1) + where
    own = int(kind == Kind.ALL_GATHER)
    return phase1 + phase2 + c * (own + n - 1) + own + where
