"""group_cast with RDMA de-duplication and its transpose group_reduce (MagiAttention's native
group collectives, after DeepEP's dispatch/combine).

group_cast: a split with destination set D is copied over NVLink to the destinations on its own
node; for each other node holding destinations it crosses RDMA once, into a relay slot on that
node's gateway with the same local rank (the source's gateway when NICs are fewer), which
forwards it over NVLink to the destinations there (itself included). Network elements:
sum over splits of size x (remote nodes holding destinations), versus size x (remote destinations)
for the flat schedule.

group_reduce: an output piece of destination d sums one piece from each listed source. Sources on
d's node are read directly by d's final reduce; for each other node b, the gateway there with
d's local rank (the combiner) first reduces the node-b sources' pieces over NVLink and sends the
node-partial over RDMA once into a relay slot on d's gateway; d then reduces its own node's
pieces and the relays into its output (accumulating, scaled by 1/sources for avg).

Pieces are chunked (`chunks`) for pipelining; sends run on channel c % C, forwards and final
reduces on C + c % C. Peers' labels resolve through the default label map (group layouts are
irregular; they are O(W^2) in the splits anyway). An unfolded simulation of group_cast reads
`group_arrays.group_cast_arrays` instead: these ops as arrays, op for op, with no label resolved.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from operator import attrgetter

from hiercoll.collectives import CollectiveSpec, Segment
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale, chunk_bounds
from hiercoll.planner.context import ParamsT, PlanContext
from hiercoll.planner.hier.common import Place, slot_table
from hiercoll.planner.labels import CastSendLabel, CombineSendLabel
from hiercoll.schedule import Region

GC_STAGE, GC_RELAY = "hier_gc_stage", "hier_gc_relay"
GR_SEND, GR_RELAY = "hier_gr_send", "hier_gr_relay"


SplitKey = tuple[int, int]          # (source rank, input split index)
AtomKey = tuple[int, int, int]      # (destination rank, atom index, source node)


def _offsets(sizes: list[int]) -> list[int]:
    out: list[int] = []
    pos = 0
    for n in sizes:
        out.append(pos)
        pos += n
    return out


def _input_offsets(ctx: PlanContext[ParamsT], rank: int) -> list[int]:
    """Where each of `rank`'s input splits starts: asked by every gateway that forwards its
    splits (once per rank, not once per gateway and source node)."""
    memo: dict[int, list[int]] = ctx.memo.setdefault("hier_gc_offsets", {})
    hit = memo.get(rank)
    if hit is None:
        assert ctx.spec.splits is not None
        hit = memo[rank] = _offsets([sp.size for sp in ctx.spec.splits.ranks[rank].input])
    return hit


def _clip(seg: Segment, lo: int, hi: int) -> Segment | None:
    """The part of `seg` whose source lies in [lo, hi), or None."""
    start, end = max(seg.src_offset, lo), min(seg.src_offset + seg.count, hi)
    if start >= end:
        return None
    return Segment(start, seg.dst_offset + start - seg.src_offset, end - start)


def _cast_segments(spec: CollectiveSpec, src: int, dst: int, split_offset: int,
                   split_size: int) -> list[Segment]:
    """Segments of src's stream to dst that come from the input split at `split_offset`.
    Segments are in input order: two bisections, not a scan per split (which made planning
    quadratic in the splits: per-token MoE splits took minutes on one node)."""
    ps = spec.pair_streams.get((src, dst))
    if ps is None:
        return []
    lo = bisect_left(ps.segments, split_offset, key=attrgetter("src_offset"))
    hi = bisect_left(ps.segments, split_offset + split_size, lo=lo, key=attrgetter("src_offset"))
    return list(ps.segments[lo:hi])


# ---- group_cast -------------------------------------------------------------------------------
def _cast_relay_table(ctx: PlanContext[ParamsT], pl: Place, node: int,
                      gateway: int) -> tuple[dict[SplitKey, int], int]:
    """Relay slots on gateway (node, gateway): one per (source, split) from another node served
    by that gateway, with a destination on `node` (in source, then split order)."""
    if GC_RELAY not in ctx.memo:
        ctx.memo[GC_RELAY] = _cast_relay_tables(ctx, pl)
    tables: dict[tuple[int, int], tuple[dict[SplitKey, int], int]] = ctx.memo[GC_RELAY]
    return tables.get((node, gateway), ({}, 0))


def _cast_relay_tables(ctx: PlanContext[ParamsT],
                       pl: Place) -> dict[tuple[int, int], tuple[dict[SplitKey, int], int]]:
    """Every gateway's relay table in one pass over the splits (O(W x splits x peers); one
    pass per gateway and node was O(W^2) per rank built). The gateway map is the plan's, not
    the rank's, so any rank's `pl` gives it."""
    spec, topo = ctx.spec, ctx.topology
    assert spec.splits is not None
    entries: dict[tuple[int, int], list[tuple[SplitKey, int]]] = {}
    for s in range(ctx.world):
        own, gateway = topo.node_of(s), pl.gateway_of(topo.local_rank_of(s))
        for i, sp in enumerate(spec.splits.ranks[s].input):
            if not sp.size:
                continue
            for node in sorted({topo.node_of(d) for d in sp.peers} - {own}):
                entries.setdefault((node, gateway), []).append(((s, i), sp.size))
    return {key: slot_table(e) for key, e in entries.items()}


def _cast_stage_table(ctx: PlanContext[ParamsT], pl: Place,
                      gateway: int) -> tuple[dict[SplitKey, int], int]:
    """Staging slots on my node's `gateway`: one per (staged client, split with remote dests)."""
    spec, topo = ctx.spec, ctx.topology
    assert spec.splits is not None
    entries: list[tuple[SplitKey, int]] = []
    for x in pl.clients(gateway):
        s = pl.at(pl.node, x)
        if x == gateway:
            continue
        for i, sp in enumerate(spec.splits.ranks[s].input):
            if sp.size and any(not topo.same_node(d, s) for d in sp.peers):
                entries.append(((s, i), sp.size))
    return slot_table(entries)


def build_group_cast(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place) -> None:
    spec, topo, r = ctx.spec, ctx.topology, pl.rank
    assert spec.splits is not None
    k, ch, gw = ctx.params.chunks, ctx.params.channels, pl.gateway_of(pl.local_rank)
    splits = spec.splits.ranks[r].input
    offs = _input_offsets(ctx, r)
    relays = {t: _cast_relay_table(ctx, pl, t, gw)[0] for t in pl.target_nodes(include_own=False)}
    stage = _cast_stage_table(ctx, pl, gw)[0] if pl.staged else {}
    local_order = [pl.at(pl.node, q) for q in pl.local_peers(include_self=True)]
    for i, sp in enumerate(splits):
        if not sp.size:
            continue
        local = [d for d in local_order if d in sp.peers]
        dst_nodes = {topo.node_of(d) for d in sp.peers}
        # the remote destination nodes in visiting order (a split reaches a few of N nodes)
        remote = sorted(dst_nodes - {pl.node}, key=lambda t: pl.target_position(t, False))
        segs = {d: _cast_segments(spec, r, d, offs[i], sp.size) for d in local}
        for c in range(k):
            lo, n = chunk_bounds(sp.size, k, c)
            if not n:   # a split smaller than `chunks`: nothing in this chunk
                continue
            for d in local:
                for seg in filter(None, (_clip(s, offs[i] + lo, offs[i] + lo + n) for s in segs[d])):
                    b.copy(ctx.input(r, seg.src_offset, seg.count),
                           ctx.output(d, seg.dst_offset, seg.count), channel=c % ch)
            if not remote:
                continue
            src = ctx.input(r, offs[i] + lo, n)
            deps: list[Dep | int] = []
            if pl.staged:
                staged = Region(pl.at(pl.node, gw), GC_STAGE, stage[(r, i)] + lo, n)
                deps = [b.copy(src, staged, channel=c % ch)]
                src = staged
            for t in remote:
                dst = Region(pl.at(t, gw), GC_RELAY, relays[t][(r, i)] + lo, n)
                b.copy(src, dst, channel=c % ch, deps=deps, label=CastSendLabel(i, t, c))
    if pl.num_nodes > 1 and pl.is_gateway:
        _forward_casts(ctx, b, pl)


def _forward_casts(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place) -> None:
    """As a gateway: forward every relayed split to its destinations on my node."""
    spec, topo, k, ch = ctx.spec, ctx.topology, ctx.params.chunks, ctx.params.channels
    assert spec.splits is not None
    table, total = _cast_relay_table(ctx, pl, pl.node, pl.local_rank)
    b.alloc(GC_RELAY, total)
    b.alloc(GC_STAGE, _cast_stage_table(ctx, pl, pl.local_rank)[1])
    relayed: dict[int, list[int]] = {}      # source rank -> its relayed split indices
    for s, i in table:
        relayed.setdefault(s, []).append(i)
    for src_node in pl.source_nodes():
        for x in pl.clients(pl.local_rank):
            s = pl.at(src_node, x)
            if s not in relayed:
                continue
            splits = spec.splits.ranks[s].input
            offs = _input_offsets(ctx, s)
            for i in relayed[s]:
                sp = splits[i]
                pieces = [(d, seg) for d in sp.peers if topo.node_of(d) == pl.node
                          for seg in _cast_segments(spec, s, d, offs[i], sp.size)]
                for c in range(k):
                    lo, n = chunk_bounds(sp.size, k, c)
                    for d, seg in pieces:
                        piece = _clip(seg, offs[i] + lo, offs[i] + lo + n)
                        if piece is None:
                            continue
                        at = table[(s, i)] + piece.src_offset - offs[i]
                        b.copy(Region(pl.rank, GC_RELAY, at, piece.count),
                               ctx.output(d, piece.dst_offset, piece.count), channel=ch + c % ch,
                               deps=[Dep(s, CastSendLabel(i, pl.node, c))])


# ---- group_reduce -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Atom:
    """A run of `count` output elements of one destination in which every contributing source's
    piece is contiguous: (source, input offset) per source; `num_sources` for avg."""

    out_offset: int
    count: int
    inputs: tuple[tuple[int, int], ...]


def reduce_atoms(spec: CollectiveSpec, dst: int) -> list[Atom]:
    """Cut `dst`'s output splits at every segment boundary of every source's stream."""
    assert spec.splits is not None
    splits = spec.splits.ranks[dst].output
    offs = _offsets([sp.size for sp in splits])
    streams = {s: sorted(ps.segments, key=lambda g: g.dst_offset)
               for (s, d), ps in spec.pair_streams.items() if d == dst}
    cuts = {o for o in offs} | {o + sp.size for o, sp in zip(offs, splits)}
    for segs in streams.values():
        cuts |= {g.dst_offset for g in segs} | {g.dst_offset + g.count for g in segs}
    points = sorted(cuts)
    starts = {s: [g.dst_offset for g in segs] for s, segs in streams.items()}
    atoms = []
    for o, sp in zip(offs, splits):
        if not sp.size or not sp.peers:
            continue
        inner = points[bisect_left(points, o):bisect_right(points, o + sp.size)]
        for x, y in zip(inner, inner[1:]):
            inputs = []
            for s in sp.peers:
                g = streams[s][bisect_right(starts[s], x) - 1]
                inputs.append((s, g.src_offset + x - g.dst_offset))
            atoms.append(Atom(x, y - x, tuple(inputs)))
    return atoms


def _reduce_relay_table(ctx: PlanContext[ParamsT], pl: Place, node: int,
                        gateway: int) -> tuple[dict[AtomKey, int], int]:
    """Relay slots on gateway (node, gateway): one per (client destination, atom, source node)."""
    topo = ctx.topology
    entries: list[tuple[AtomKey, int]] = []
    for x in pl.clients(gateway):
        d = pl.at(node, x)
        for j, atom in enumerate(reduce_atoms(ctx.spec, d)):
            for src_node in sorted({topo.node_of(s) for s, _ in atom.inputs} - {node}):
                entries.append(((d, j, src_node), atom.count))
    return slot_table(entries)


def build_group_reduce(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place) -> None:
    if pl.num_nodes > 1 and pl.is_gateway:
        _combine_for_remote(ctx, b, pl)
    spec, topo, k, ch = ctx.spec, ctx.topology, ctx.params.chunks, ctx.params.channels
    gw = pl.gateway_of(pl.local_rank)
    table: dict[AtomKey, int] = _reduce_relay_table(ctx, pl, pl.node, gw)[0] if pl.num_nodes > 1 else {}
    for j, atom in enumerate(reduce_atoms(spec, pl.rank)):
        remote = sorted({topo.node_of(s) for s, _ in atom.inputs} - {pl.node})
        for c in range(k):
            lo, n = chunk_bounds(atom.count, k, c)
            if not n:
                continue
            srcs = [ctx.input(s, off + lo, n) for s, off in atom.inputs if topo.node_of(s) == pl.node]
            srcs += [Region(pl.at(pl.node, gw), GR_RELAY, table[(pl.rank, j, m)] + lo, n) for m in remote]
            deps: list[Dep | int] = [Dep(pl.at(m, gw), CombineSendLabel(pl.rank, j, c)) for m in remote]
            b.reduce(srcs, ctx.output(pl.rank, atom.out_offset + lo, n), accumulate=True,
                     scale=avg_scale(spec, len(atom.inputs)), channel=ch + c % ch, deps=deps)


def _combine_for_remote(ctx: PlanContext[ParamsT], b: RankBuilder, pl: Place) -> None:
    """As a gateway: for each client destination on other nodes, reduce my node's sources'
    pieces over NVLink and send the node-partial once over RDMA to its gateway's relay."""
    topo, k, ch = ctx.topology, ctx.params.chunks, ctx.params.channels
    b.alloc(GR_RELAY, _reduce_relay_table(ctx, pl, pl.node, pl.local_rank)[1])
    sent = 0
    for t in pl.target_nodes(include_own=False):
        relay = _reduce_relay_table(ctx, pl, t, pl.local_rank)[0]
        for x in pl.clients(pl.local_rank):
            d = pl.at(t, x)
            for j, atom in enumerate(reduce_atoms(ctx.spec, d)):
                mine = [(s, off) for s, off in atom.inputs if topo.node_of(s) == pl.node]
                for c in range(k) if mine else ():
                    lo, n = chunk_bounds(atom.count, k, c)
                    if not n:
                        continue
                    dst = Region(pl.at(t, pl.local_rank), GR_RELAY, relay[(d, j, pl.node)] + lo, n)
                    src = ctx.input(mine[0][0], mine[0][1] + lo, n)
                    deps: list[Dep | int] = []
                    if [s for s, _ in mine] != [pl.rank]:
                        src = Region(pl.rank, GR_SEND, sent, n)
                        deps = [b.reduce([ctx.input(s, off + lo, n) for s, off in mine], src,
                                         channel=c % ch)]
                        sent += n
                    b.copy(src, dst, channel=c % ch, deps=deps, label=CombineSendLabel(d, j, c))
    b.alloc(GR_SEND, sent)
