"""A schedule and its network as flat tables, built once per simulation for the compiled loop.

Ops are numbered rank by rank (the simulated ranks, in order), so op (r, i) is row
`offset[r] + i`; a dependency is a row (folded onto its representative's like the Python
engine's), -1 for one that names no op (it never ends: the run reports a deadlock). An op's
links are those of its shape (`LinkCache`: ops that move data between the same ranks the same way
share one entry), so a ring's millions of ops index a handful of link lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hiercoll.schedule import OpKind, Schedule
from hiercoll.schedule_arrays import OpArrays, op_arrays_from_ops
from hiercoll.sim.engine import LinkCache
from hiercoll.sim.links import Network

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


@dataclass
class Tables:
    ranks: list[int]
    lens: list[int]            # ops per simulated rank
    op_shape: I64              # row -> its shape (link list)
    op_nbytes: F64             # bytes it moves
    op_delay: F64              # launch + first byte's flight, us
    dep_ptr: I64               # CSR: op rows of its dependencies
    dep_idx: I64
    ch_ptr: I64                # CSR: each (rank, channel)'s op rows in order, (rank, channel) order
    ch_ops: I64
    sh_ptr: I64                # CSR: each shape's (link id, weight)
    sh_lid: I64
    sh_w: F64
    max_links: int             # most links of one shape
    op_ce: B | None = None     # row -> a copy engine runs it (host launches count these)

    @property
    def num_ops(self) -> int:
        return len(self.op_shape)


def build_tables(schedule: Schedule, net: Network, ranks: Sequence[int]) -> Tables | None:
    """The tables, or None where the schedule is not laid out as the tables assume (an op's
    ref is not (its rank, its position)): the Python engine times that one."""
    arrays = op_arrays_from_ops([schedule.rank_ops(r) for r in ranks], ranks)
    return None if arrays is None else tables_from_arrays(arrays, net, schedule.spec.dtype.itemsize)


def tables_from_arrays(a: OpArrays, net: Network, itemsize: int) -> Tables:
    """The tables of ops in array form, over arrays: per-op work is numpy's, per-shape work
    (links, latency) Python's through the same `LinkCache` the Python engine asks, in the same
    order (links a shape creates get the same ids)."""
    costs = net.topology.costs
    cached = LinkCache(net)
    n, npro = a.num_ops, len(a.protos)
    p_copy = np.fromiter((p.kind == OpKind.COPY for p in a.protos), bool, npro)
    p_remote = np.fromiter((p.dst != p.rank or p.srcs[0] != p.rank for p in a.protos), bool, npro)
    count = a.count
    # on_copy_engine over the arrays
    ce = p_copy[a.proto] & (count * itemsize >= max(costs.ce_threshold_bytes, 1)) & p_remote[a.proto]
    # one stand-in op per (prototype, channel, engine), asked in the order of its first row
    nch = int(a.channel.max()) + 1 if n else 1
    key = (a.proto * nch + a.channel) * 2 + ce
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    shape_of: dict[int, int] = {}       # id of a cached link tuple -> shape row
    sh_ptr, sh_lid, sh_w = [0], [], []
    key_shape = np.zeros(len(uniq), np.int64)
    key_latency = np.zeros(len(uniq), np.float64)
    for u in order.tolist():
        row = int(first[u])
        op = a.protos[int(a.proto[row])].op(int(a.channel[row]), int(count[row]))
        links, latency = cached(op)
        sid = shape_of.get(id(links))
        if sid is None:
            sid = shape_of[id(links)] = len(sh_ptr) - 1
            for lid, w in links:
                sh_lid.append(lid)
                sh_w.append(w)
            sh_ptr.append(len(sh_lid))
        key_shape[u], key_latency[u] = sid, latency
    inverse = inverse.reshape(-1)
    launch = np.where(ce, costs.op_launch_us(True), costs.op_launch_us(False))
    op_delay = launch + key_latency[inverse]        # as the Python engine sums them
    # dependencies: rows of the (folded) ranks' ops, -1 for an op that does not exist
    fold = net.fold
    dr = a.dep_rank % fold if fold is not None else a.dep_rank
    offsets = a.offsets()
    top = max(int(dr.max()) + 1 if len(dr) else 0, max(a.ranks, default=-1) + 1)
    row_of = np.full(top + 1, -1, np.int64)
    len_of = np.zeros(top + 1, np.int64)
    row_of[a.ranks], len_of[a.ranks] = offsets, a.lens
    dr = np.where((dr >= 0) & (dr < top), dr, top)
    di = a.dep_index
    ok = (row_of[dr] >= 0) & (di >= 0) & (di < len_of[dr])
    dep_idx = np.where(ok, row_of[dr] + di, -1)
    # channels: rows grouped by (rank, channel) in that order, each group in row order
    rank_pos = np.repeat(np.arange(len(a.ranks), dtype=np.int64), a.lens)
    group = rank_pos * nch + a.channel
    ch_ops = np.argsort(group, kind="stable")
    g_sorted = group[ch_ops]
    starts = np.flatnonzero(np.diff(g_sorted)) + 1 if n else np.zeros(0, np.int64)
    ch_ptr = np.concatenate([[0], starts, [n]]).astype(np.int64) if n else np.zeros(1, np.int64)
    sp = np.array(sh_ptr, np.int64)
    return Tables(ranks=list(a.ranks), lens=a.lens.tolist(), op_shape=key_shape[inverse],
                  op_nbytes=(count * itemsize).astype(np.float64), op_delay=op_delay,
                  dep_ptr=a.dep_ptr, dep_idx=dep_idx.astype(np.int64),
                  ch_ptr=ch_ptr, ch_ops=ch_ops.astype(np.int64),
                  sh_ptr=sp, sh_lid=np.array(sh_lid, np.int64), sh_w=np.array(sh_w, np.float64),
                  max_links=max(int(np.diff(sp).max()), 1) if len(sp) > 1 else 1, op_ce=ce)
