"""`hier`'s group_cast written straight as arrays (schedule_arrays), op for op what
`group.build_group_cast` emits.

An unfolded 1024-GPU MoE dispatch is ~0.9M ops; building each as an `Op` (regions, labels
resolved by building the peer's label map, then converted back to arrays) was a third of the
run. Here every op is a row of a few flat numpy arrays over all ranks: a row knows its rank and
a sort key that reproduces the recipe's loop order, so one lexsort places every op at its index,
and a dependency (a forward waits for the source's RDMA send) is looked up by row, not by label.

Rows of a rank, in `build_group_cast`'s order: per input split i (nonzero) and chunk c, the
NVLink copies to its own node's destinations (local visiting order, each pair stream's
segments in order), the staging copy to its gateway (fewer NICs than GPUs), the sends to each
remote destination node (node visiting order); then, on a gateway, the forwards of what other
nodes relayed to it: per source node (arrival order), client local rank, split, chunk, the
split's destinations on this node in `peers` order, their segments.

Tests (tests/test_hier_group_arrays.py) compare the rows with the built ops on random specs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hiercoll.planner.context import PlanContext
from hiercoll.planner.hier.common import HierParams, Place
from hiercoll.schedule import OpKind
from hiercoll.schedule_arrays import I64, OpArrays, Proto

PHASE_LOCAL, PHASE_STAGE, PHASE_SEND = 0, 1, 2       # within a (split, chunk)
KEYS = 6            # sort columns after (rank, forward?)
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class _Splits:
    """Every rank's input splits, flat in (rank, index) order."""

    rank: I64
    index: I64            # the split's index in its rank's input
    size: I64
    start: I64            # global start: the splits of all ranks laid end to end
    rank_start: I64       # per rank: global start of its input


@dataclass(frozen=True)
class _Segs:
    """Every pair stream's segments, flat in (src, dst, stream) order, with their split."""

    split: I64            # row of _Splits the segment lies in
    dst: I64
    start: I64            # global start (as _Splits.start)
    count: I64
    peer_pos: I64         # the destination's position in the split's `peers`


@dataclass
class _Rows:
    """Ops under construction, one entry per op, unordered: per part, its columns. An op's
    place in its rank is (rank, forward?, key...) in lexicographic order."""

    parts: list[dict[str, I64]]

    def add(self, rank: I64, forward: bool, key: list[I64], dst: I64, src: I64, channel: I64,
            count: I64, dep_row: I64 | None = None) -> I64:
        """Append ops (key: up to KEYS sort columns); returns their row ids, for dependencies."""
        first = sum(len(p["rank"]) for p in self.parts)
        m = len(rank)
        cols = {"rank": rank, "forward": np.full(m, int(forward), np.int64), "dst": dst, "src": src,
                "channel": channel, "count": count,
                "dep_row": np.full(m, -1, np.int64) if dep_row is None else dep_row}
        for j in range(KEYS):
            cols[f"k{j}"] = key[j] if j < len(key) else np.zeros(m, np.int64)
        self.parts.append(cols)
        return np.arange(first, first + m, dtype=np.int64)

    def column(self, name: str) -> I64:
        return np.concatenate([p[name] for p in self.parts])


def _flat_splits(ctx: PlanContext[HierParams]) -> tuple[_Splits, I64, I64, I64]:
    """The splits, and their peers flat: (split row, destination, position in peers)."""
    assert ctx.spec.splits is not None
    inputs = [rs.input for rs in ctx.spec.splits.ranks]
    per_rank = np.array([len(x) for x in inputs], np.int64)
    size = np.fromiter((sp.size for x in inputs for sp in x), np.int64, int(per_rank.sum()))
    npeers = np.fromiter((len(sp.peers) for x in inputs for sp in x), np.int64, len(size))
    first = np.zeros(len(per_rank) + 1, np.int64)
    np.cumsum(per_rank, out=first[1:])
    rank = np.repeat(np.arange(len(per_rank), dtype=np.int64), per_rank)
    start = np.zeros(len(size) + 1, np.int64)
    np.cumsum(size, out=start[1:])
    splits = _Splits(rank, np.arange(len(size), dtype=np.int64) - first[rank], size, start[:-1],
                     start[first[:-1]])
    pe_split = np.repeat(np.arange(len(size), dtype=np.int64), npeers)
    pe_dst = np.fromiter(itertools.chain.from_iterable(sp.peers for x in inputs for sp in x),
                         np.int64, len(pe_split))
    pe_ptr = np.zeros(len(size) + 1, np.int64)
    np.cumsum(npeers, out=pe_ptr[1:])
    return splits, pe_split, pe_dst, np.arange(len(pe_split), dtype=np.int64) - pe_ptr[pe_split]


def _flat_segments(ctx: PlanContext[HierParams], sp: _Splits, pe_split: I64, pe_dst: I64,
                   pe_pos: I64) -> _Segs:
    """The pair streams' segments (what `_cast_segments` bisects), each with its split row
    (a segment never crosses a split) and its destination's position in that split's peers."""
    streams = ctx.spec.pair_streams
    nseg = np.fromiter((len(ps.segments) for ps in streams.values()), np.int64, len(streams))
    src = np.repeat(np.fromiter((s for s, _ in streams), np.int64, len(streams)), nseg)
    dst = np.repeat(np.fromiter((d for _, d in streams), np.int64, len(streams)), nseg)
    total = int(nseg.sum())
    segs = list(itertools.chain.from_iterable(ps.segments for ps in streams.values()))
    off = np.fromiter((g.src_offset for g in segs), np.int64, total)
    count = np.fromiter((g.count for g in segs), np.int64, total)
    start = sp.rank_start[src] + off
    split = np.searchsorted(sp.start, start, side="right") - 1    # zero-size splits: the later
    w = len(sp.rank_start)
    pe_key = pe_split * w + pe_dst
    order = np.argsort(pe_key, kind="stable")
    at = order[np.searchsorted(pe_key, split * w + dst, sorter=order)]
    return _Segs(split, dst, start, count, pe_pos[at])


def _chunks(size: I64, k: int) -> tuple[I64, I64]:
    """`chunk_bounds` over arrays: (offset, count) of every chunk, [splits, k]."""
    base, extra = np.divmod(size, k)
    c = np.arange(k, dtype=np.int64)[None, :]
    return c * base[:, None] + np.minimum(c, extra[:, None]), base[:, None] + (c < extra[:, None])


def _positions(orders: Sequence[Sequence[int]], n: int) -> I64:
    """[a, x]: index of x in orders[a] (-1 where absent)."""
    out = np.full((len(orders), n), -1, np.int64)
    for a, order in enumerate(orders):
        out[a, list(order)] = np.arange(len(order))
    return out


def _pieces(segs: _Segs, mask: Mask, lo: I64, n: I64, split_start: I64) -> tuple[I64, I64, I64]:
    """The chunk pieces of the segments `mask` picks (`_clip` per chunk): (segment, chunk,
    count) of every nonempty one, in (segment, chunk) order."""
    seg = np.flatnonzero(mask)
    s = segs.split[seg]
    a = split_start[s][:, None] + lo[s]
    first = np.maximum(segs.start[seg][:, None], a)
    last = np.minimum((segs.start + segs.count)[seg][:, None], a + n[s])
    keep = first < last
    rows, c = np.nonzero(keep)
    return seg[rows], c.astype(np.int64), (last - first)[keep]


def _grid(x: I64, live: Mask) -> tuple[I64, I64]:
    """(entry of x, chunk) of every live cell of a [len(x), k] grid, in (entry, chunk) order."""
    i, c = np.nonzero(live)
    return x[i], c.astype(np.int64)


@dataclass(frozen=True)
class _Plan:
    """The plan's per-split numbers every part of the recipe reads."""

    g: int
    nn: int                # nodes
    k: int
    chans: int
    sp: _Splits
    segs: _Segs
    node: I64              # per split: its rank's node
    lr: I64                # per split: its rank's local rank
    gw_local: I64          # per split: its rank's gateway's local rank
    staged: Mask           # per split: whether its rank stages through its gateway
    lo: I64                # [split, chunk] chunk_bounds
    n: I64

    @staticmethod
    def of(ctx: PlanContext[HierParams]) -> _Plan:
        topo, p = ctx.topology, ctx.params
        g, nn = topo.gpus_per_node, topo.num_nodes
        sp, pe_split, pe_dst, pe_pos = _flat_splits(ctx)
        gw_of = np.array([Place.of(ctx, 0).gateway_of(x) for x in range(g)], np.int64)
        lr = sp.rank % g
        lo, n = _chunks(sp.size, p.chunks)
        return _Plan(g, nn, p.chunks, p.channels, sp, _flat_segments(ctx, sp, pe_split, pe_dst, pe_pos),
                     sp.rank // g, lr, gw_of[lr], (gw_of[lr] != lr) & (nn > 1), lo, n)


def _local_copies(ctx: PlanContext[HierParams], pn: _Plan, rows: _Rows, local: Mask) -> None:
    """Each split's NVLink copies to its own node's destinations (local visiting order)."""
    g = pn.g
    local_pos = np.array([[Place.of(ctx, l).peer_position(q, include_self=True) for q in range(g)]
                          for l in range(g)], np.int64)
    seg, c, cnt = _pieces(pn.segs, local, pn.lo, pn.n, pn.sp.start)
    s = pn.segs.split[seg]
    dst = pn.segs.dst[seg]
    rows.add(pn.sp.rank[s], False, [pn.sp.index[s], c, np.full(len(s), PHASE_LOCAL),
                                    local_pos[pn.lr[s], dst % g], seg],
             dst, pn.sp.rank[s], c % pn.chans, cnt)


def _sends(ctx: PlanContext[HierParams], pn: _Plan, rows: _Rows, pairs: I64) -> I64:
    """Each split's RDMA sends to its remote nodes' gateways (node visiting order), after its
    staging copy where the rank stages; returns each (pair, chunk)'s row (-1: no op)."""
    g, nn, k, sp = pn.g, pn.nn, pn.k, pn.sp
    gw = pn.node * g + pn.gw_local
    remote = np.unique(pairs // nn)
    st, st_c = _grid(remote, pn.staged[remote][:, None] & (pn.n[remote] > 0))
    stage_row = np.full(len(sp.size) * k, -1, np.int64)
    stage_row[st * k + st_c] = rows.add(
        sp.rank[st], False, [sp.index[st], st_c, np.full(len(st), PHASE_STAGE)],
        gw[st], sp.rank[st], st_c % pn.chans, pn.n[st, st_c])
    tpos = _positions([Place.of(ctx, a * g).target_nodes(include_own=False) for a in range(nn)], nn)
    pair, c = _grid(np.arange(len(pairs), dtype=np.int64), pn.n[pairs // nn] > 0)
    s, t = pairs[pair] // nn, pairs[pair] % nn
    send_row = np.full(len(pairs) * k, -1, np.int64)
    send_row[pair * k + c] = rows.add(
        sp.rank[s], False, [sp.index[s], c, np.full(len(s), PHASE_SEND), tpos[pn.node[s], t]],
        t * g + pn.gw_local[s], np.where(pn.staged[s], gw[s], sp.rank[s]), c % pn.chans,
        pn.n[s, c], np.where(pn.staged[s], stage_row[s * k + c], -1))
    return send_row


def _forwards(ctx: PlanContext[HierParams], pn: _Plan, rows: _Rows, remote: Mask, pairs: I64,
              send_row: I64) -> None:
    """The gateways' NVLink forwards of relayed splits, each after the send it forwards."""
    g, nn, k = pn.g, pn.nn, pn.k
    spos = _positions([Place.of(ctx, a * g).source_nodes() for a in range(nn)], nn)
    seg, c, cnt = _pieces(pn.segs, remote, pn.lo, pn.n, pn.sp.start)
    s = pn.segs.split[seg]
    dst = pn.segs.dst[seg]
    node = dst // g
    at = node * g + pn.gw_local[s]
    pair = np.searchsorted(pairs, s * nn + node)
    rows.add(at, True, [spos[node, pn.node[s]], pn.lr[s], pn.sp.index[s], c, pn.segs.peer_pos[seg], seg],
             dst, at, pn.chans + c % pn.chans, cnt, send_row[pair * k + c])


def group_cast_arrays(ctx: PlanContext[HierParams], ranks: Sequence[int]) -> OpArrays | None:
    """`ranks`' ops of a `hier` group_cast as arrays (every rank's rows are computed: a
    forward's dependency is a row of its source's program)."""
    if not ranks:
        return None
    pn = _Plan.of(ctx)
    g, nn, segs = pn.g, pn.nn, pn.segs
    local = segs.dst // g == pn.node[segs.split]
    rows = _Rows([])
    _local_copies(ctx, pn, rows, local)
    remote = ~local
    pairs = np.unique(segs.split[remote] * nn + segs.dst[remote] // g)    # (split, remote node)
    send_row = _sends(ctx, pn, rows, pairs)
    _forwards(ctx, pn, rows, remote, pairs, send_row)
    return _assemble(rows, ctx.world, ranks)


def _assemble(rows: _Rows, w: int, ranks: Sequence[int]) -> OpArrays:
    """Order every rank's rows by their keys, resolve dependency rows to (rank, index), and
    keep `ranks`' rows (prototypes numbered in first use, as `op_arrays_from_ops` does)."""
    rank = rows.column("rank")
    keys = [rows.column(f"k{j}") for j in reversed(range(KEYS))]
    order = np.lexsort(keys + [rows.column("forward"), rank])
    lens = np.bincount(rank, minlength=w).astype(np.int64)
    starts = np.zeros(w, np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    index = np.empty(len(rank), np.int64)
    index[order] = np.arange(len(rank), dtype=np.int64) - starts[rank[order]]
    if list(ranks) != list(range(w)):
        want = np.array(ranks, np.int64)
        order = order[np.concatenate([np.arange(starts[r], starts[r] + lens[r]) for r in want.tolist()])]
        lens = lens[want]
    dep = rows.column("dep_row")[order]
    has = dep >= 0
    dep_ptr = np.zeros(len(order) + 1, np.int64)
    np.cumsum(has, out=dep_ptr[1:])
    r, d, s = rank[order], rows.column("dst")[order], rows.column("src")[order]
    key = (r * w + d) * w + s
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    by_first = np.argsort(first)
    renum = np.empty(len(uniq), np.int64)
    renum[by_first] = np.arange(len(uniq), dtype=np.int64)
    protos = [Proto(OpKind.COPY, int(u) // (w * w), int(u) // w % w, (int(u) % w,), False)
              for u in uniq[by_first].tolist()]
    return OpArrays(ranks=list(ranks), lens=lens, protos=protos,
                    proto=renum[inverse.reshape(-1)].astype(np.int32),
                    channel=rows.column("channel")[order].astype(np.int32),
                    count=rows.column("count")[order].astype(np.int64), dep_ptr=dep_ptr,
                    dep_rank=rank[dep[has]].astype(np.int32), dep_index=index[dep[has]].astype(np.int32))
