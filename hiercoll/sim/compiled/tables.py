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

from hiercoll.schedule import Schedule
from hiercoll.sim.engine import LinkCache
from hiercoll.sim.links import Network

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


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

    @property
    def num_ops(self) -> int:
        return len(self.op_shape)


def build_tables(schedule: Schedule, net: Network, ranks: Sequence[int]) -> Tables | None:
    """The tables, or None where the schedule is not laid out as the tables assume (an op's
    ref is not (its rank, its position)): the Python engine times that one."""
    isz = schedule.spec.dtype.itemsize
    fold = net.fold
    cached = LinkCache(net)
    per_rank = [schedule.rank_ops(r) for r in ranks]
    lens = [len(ops) for ops in per_rank]
    offset = {r: 0 for r in ranks}
    total = 0
    for r, n in zip(ranks, lens):
        offset[r] = total
        total += n
    shape_of: dict[int, int] = {}       # id of a cached link tuple -> shape row
    sh_ptr, sh_lid, sh_w = [0], [], []
    op_shape: list[int] = []
    op_nbytes: list[int] = []
    op_delay: list[float] = []
    dep_count: list[int] = []
    dep_idx: list[int] = []
    ch_ptr, ch_ops = [0], []
    launch_us, get_shape, get_offset, get_len = cached.launch_us, shape_of.get, offset.get, dict(zip(ranks, lens)).get
    for r, ops in zip(ranks, per_rank):
        base = offset[r]
        by_channel: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            if op.index != i or op.rank != r:
                return None
            links, latency = cached(op)
            sid = get_shape(id(links))
            if sid is None:
                sid = shape_of[id(links)] = len(sh_ptr) - 1
                for lid, w in links:
                    sh_lid.append(lid)
                    sh_w.append(w)
                sh_ptr.append(len(sh_lid))
            op_shape.append(sid)
            op_nbytes.append(op.dst.count * isz)
            op_delay.append(launch_us(op) + latency)    # as the Python engine sums them
            deps = op.deps
            dep_count.append(len(deps))
            for dr, di in deps:
                if fold is not None:
                    dr %= fold
                row, count = get_offset(dr), get_len(dr)
                dep_idx.append(row + di if row is not None and count is not None and 0 <= di < count else -1)
            chan = by_channel.get(op.channel)
            if chan is None:
                chan = by_channel[op.channel] = []
            chan.append(base + i)
        for c in sorted(by_channel):
            ch_ops.extend(by_channel[c])
            ch_ptr.append(len(ch_ops))
    dep_ptr = np.zeros(total + 1, np.int64)
    np.cumsum(np.array(dep_count, np.int64), out=dep_ptr[1:])
    sp = np.array(sh_ptr, np.int64)
    return Tables(ranks=list(ranks), lens=lens, op_shape=np.array(op_shape, np.int64),
                  op_nbytes=np.array(op_nbytes, np.float64), op_delay=np.array(op_delay, np.float64),
                  dep_ptr=dep_ptr, dep_idx=np.array(dep_idx, np.int64),
                  ch_ptr=np.array(ch_ptr, np.int64), ch_ops=np.array(ch_ops, np.int64),
                  sh_ptr=sp, sh_lid=np.array(sh_lid, np.int64), sh_w=np.array(sh_w, np.float64),
                  max_links=max(int(np.diff(sp).max()), 1) if len(sp) > 1 else 1)
