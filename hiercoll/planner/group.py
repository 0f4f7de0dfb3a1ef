"""Flat (direct) group-cast and group-reduce: each (source, destination) pair's stream moves in
one go, destinations visited in swizzled order. The hierarchical planner reuses the staging
layout helpers here."""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

from hiercoll.collectives import CollectiveSpec, dense_counts
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale, chunk_bounds, swizzled_peers
from hiercoll.planner.context import ParamsT, PlanContext
from hiercoll.planner.labels import GroupSendLabel
from hiercoll.schedule import OpKind, Region
from hiercoll.schedule_arrays import OpArrays, Proto

STAGE = "group_stage"


def stage_bases(spec: CollectiveSpec, dst: int) -> tuple[dict[int, int], int]:
    """Where each source's stream starts in `dst`'s staging buffer (sources in rank order)."""
    bases: dict[int, int] = {}
    pos = 0
    for s in range(spec.world_size):
        ps = spec.pair_streams.get((s, dst))
        if ps is not None and ps.total:
            bases[s] = pos
            pos += ps.total
    return bases, pos


def output_pieces(spec: CollectiveSpec, dst: int) -> list[tuple[int, int, dict[int, int]]]:
    """For each output split of `dst` with rows and sources: (offset, size, {source: offset in
    its stream}). A group-reduce split nobody sends to keeps its rows (nothing to add): no op."""
    assert spec.splits is not None
    pieces: list[tuple[int, int, dict[int, int]]] = []
    off = 0
    stream_pos: dict[int, int] = {}
    for sp in spec.splits.ranks[dst].output:
        at: dict[int, int] = {}
        for s in sp.peers:
            at[s] = stream_pos.get(s, 0)
            stream_pos[s] = at[s] + sp.size
        if sp.size and at:
            pieces.append((off, sp.size, at))
        off += sp.size
    return pieces


def build_group_cast(ctx: PlanContext[ParamsT], b: RankBuilder, swizzle: bool) -> None:
    r, spec, k = b.rank, ctx.spec, ctx.params.chunks
    for d in swizzled_peers(r, ctx.world, swizzle, include_self=True,
                                gpus=ctx.topology.gpus_per_node):
        ps = spec.pair_streams.get((r, d))
        if ps is None:
            continue
        for seg in ps.segments:
            for c in range(k):
                coff, cn = chunk_bounds(seg.count, k, c)
                if cn:
                    b.copy(ctx.input(r, seg.src_offset + coff, cn),
                           ctx.output(d, seg.dst_offset + coff, cn),
                           channel=c % ctx.params.channels)


def group_cast_arrays(ctx: PlanContext[ParamsT], ranks: Sequence[int], swizzle: bool) -> OpArrays:
    """`build_group_cast`'s ops of `ranks` as arrays, op for op: copies with no dependencies, one
    prototype per (source, destination) pair. A dense 1024-GPU all-to-all-v is a million ops,
    and building each as an `Op` (regions, transport) cost several times the replay."""
    spec, k, chans = ctx.spec, ctx.params.chunks, ctx.params.channels
    assert spec.splits is not None
    dense = dense_counts(spec.splits, ctx.world)
    if dense is not None:
        return _dense_group_cast_arrays(dense, ctx.world, ranks, swizzle,
                                        ctx.topology.gpus_per_node, k, chans)
    streams = spec.pair_streams
    protos: list[Proto] = []
    proto: list[int] = []
    channel: list[int] = []
    count: list[int] = []
    lens: list[int] = []
    for r in ranks:
        start = len(proto)
        for d in swizzled_peers(r, ctx.world, swizzle, include_self=True, gpus=ctx.topology.gpus_per_node):
            ps = streams.get((r, d))
            if ps is None:
                continue
            pid = len(protos)
            used = False
            for seg in ps.segments:
                for c in range(k):
                    cn = chunk_bounds(seg.count, k, c)[1]
                    if cn:
                        proto.append(pid)
                        channel.append(c % chans)
                        count.append(cn)
                        used = True
            if used:
                protos.append(Proto(OpKind.COPY, r, d, (r,), False))
        lens.append(len(proto) - start)
    n = len(proto)
    none = np.zeros(0, np.int32)
    return OpArrays(ranks=list(ranks), lens=np.array(lens, np.int64), protos=protos,
                    proto=np.array(proto, np.int32), channel=np.array(channel, np.int32),
                    count=np.array(count, np.int64), dep_ptr=np.zeros(n + 1, np.int64),
                    dep_rank=none, dep_index=none)


def _dense_group_cast_arrays(counts: np.ndarray, world: int, ranks: Sequence[int], swizzle: bool,
                             gpus: int, k: int, chans: int) -> OpArrays:
    """`group_cast_arrays` of `GroupSplits.from_counts`' splits, from the matrix: each pair is
    one segment (its stream is counts[r][d] elements), so no pair stream is built; rank by rank
    in numpy, the same rows."""
    protos: list[Proto] = []
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    lens: list[int] = []
    c = np.arange(k, dtype=np.int64)
    for r in ranks:
        peers = np.array(swizzled_peers(r, world, swizzle, include_self=True, gpus=gpus), np.int64)
        n = counts[r, peers]
        peers, n = peers[n > 0], n[n > 0]
        base, extra = np.divmod(n, k)
        cn = base[:, None] + (c[None, :] < extra[:, None])     # chunk_bounds' counts, [pairs, k]
        live = cn > 0
        pid = np.broadcast_to(np.arange(len(peers))[:, None] + len(protos), cn.shape)
        parts.append((pid[live], np.broadcast_to(c % chans, cn.shape)[live], cn[live]))
        protos.extend(Proto(OpKind.COPY, r, d, (r,), False) for d in peers.tolist())
        lens.append(int(live.sum()))
    cat = np.concatenate
    n_ops = sum(lens)
    none = np.zeros(0, np.int32)
    return OpArrays(ranks=list(ranks), lens=np.array(lens, np.int64), protos=protos,
                    proto=cat([p[0] for p in parts]).astype(np.int32) if parts else none,
                    channel=cat([p[1] for p in parts]).astype(np.int32) if parts else none,
                    count=cat([p[2] for p in parts]).astype(np.int64) if parts else none.astype(np.int64),
                    dep_ptr=np.zeros(n_ops + 1, np.int64), dep_rank=none, dep_index=none)


def build_group_reduce(ctx: PlanContext[ParamsT], b: RankBuilder, swizzle: bool) -> None:
    """Sources copy their stream into the destination's staging; the destination then sums one
    piece per listed source into each output split (accumulating into what was there)."""
    r, spec = b.rank, ctx.spec
    for d in swizzled_peers(r, ctx.world, swizzle, include_self=True,
                                gpus=ctx.topology.gpus_per_node):
        ps = spec.pair_streams.get((r, d))
        if ps is None or not ps.total:
            continue
        base, pos = stage_bases(spec, d)[0][r], 0
        for i, seg in enumerate(ps.segments):
            b.copy(ctx.input(r, seg.src_offset, seg.count),
                   Region(d, STAGE, base + pos, seg.count), channel=0, label=GroupSendLabel(d, i))
            pos += seg.count
    bases, total = stage_bases(spec, r)
    b.alloc(STAGE, total)
    _reduce_pieces(ctx, b, bases, channel=ctx.params.channels)


def _sends_under(ctx: PlanContext[ParamsT], src: int, dst: int, at: int, size: int) -> range:
    """Indices of src's sends to dst (its pair stream's segments, in stream order) that cover
    stream positions [at, at + size): a piece waits for those, not for every send of the pair
    (with one split per token that was quadratic in the tokens)."""
    memo: dict[tuple[int, int], list[int]] = ctx.memo.setdefault("group_reduce_starts", {})
    starts = memo.get((src, dst))
    if starts is None:
        segs = ctx.spec.pair_streams[(src, dst)].segments
        starts = memo[(src, dst)] = list(itertools.accumulate((g.count for g in segs), initial=0))
    return range(max(0, bisect_right(starts, at) - 1), bisect_left(starts, at + size))


def _reduce_pieces(ctx: PlanContext[ParamsT], b: RankBuilder, bases: dict[int, int], channel: int) -> None:
    r, spec = b.rank, ctx.spec
    for off, size, at in output_pieces(spec, r):
        srcs = [Region(r, STAGE, bases[s] + at[s], size) for s in sorted(at)]
        scale = avg_scale(spec, len(at))
        b.reduce(srcs, ctx.output(r, off, size), accumulate=True, scale=scale, channel=channel,
                 deps=[Dep(s, GroupSendLabel(r, i)) for s in sorted(at)
                       for i in _sends_under(ctx, s, r, at[s], size)])
