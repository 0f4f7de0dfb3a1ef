"""Some ranks' ops as flat arrays: what the simulator reads of an op, without an `Op` per op.

A large unfolded simulation (a 1024-GPU ring: two million ops) spent ten times longer building
`Op` objects (regions, label resolution) than the compiled core spent replaying them. An
algorithm that can write its ops straight into arrays (`Algorithm.op_arrays`; the ring does)
skips that; `op_arrays_from_ops` converts any built op lists, so every schedule has this form.

What an op keeps: its channel, its element count, its dependencies, and a *prototype*: (kind,
issuing rank, dst rank, src ranks, accumulate), the fields that with the channel and the count
decide its network links, its launch cost and whether a copy engine runs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hiercoll.schedule import Op, OpKind, Region, Schedule

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class Proto:
    """What an op's links and costs depend on besides its channel and element count."""

    kind: OpKind
    rank: int                  # the issuing rank
    dst: int                   # the destination region's rank
    srcs: tuple[int, ...]      # the source regions' ranks, in order
    accumulate: bool

    def op(self, channel: int, count: int) -> Op:
        """A stand-in op of this shape (regions on a dummy buffer): what `LinkCache` and the
        copy-engine test read of a real op are exactly these fields."""
        return Op(rank=self.rank, index=0, channel=channel, kind=self.kind,
                  dst=Region(self.dst, "", 0, count), srcs=tuple(Region(s, "", 0, count) for s in self.srcs),
                  accumulate=self.accumulate)


@dataclass(frozen=True)
class OpArrays:
    """`ranks`' ops, rank after rank, each rank's in index order (op (ranks[j], i) is row
    sum(lens[:j]) + i). Dependencies are CSR rows of unfolded (rank, index) coordinates, in the
    op's own `deps` order. Per-op fields that fit are int32: a 4096-GPU ring holds 33M ops and
    twice as many deps, and these arrays are alive while the simulator's tables are built."""

    ranks: list[int]
    lens: I64            # ops per rank
    protos: list[Proto]
    proto: I32           # row -> index into protos
    channel: I32
    count: I64           # elements the op moves (its dst's count)
    dep_ptr: I64         # row's deps are dep_rank/dep_index[dep_ptr[row]:dep_ptr[row + 1]]
    dep_rank: I32
    dep_index: I32

    @property
    def num_ops(self) -> int:
        return len(self.proto)

    def offsets(self) -> I64:
        """First row of each rank."""
        out = np.zeros(len(self.lens), np.int64)
        np.cumsum(self.lens[:-1], out=out[1:])
        return out


def native_op_arrays(schedule: Schedule, ranks: Sequence[int]) -> OpArrays | None:
    """`ranks`' ops in the array form their source writes directly (a planner recipe whose
    algorithm has one), else None: the caller then builds the ops."""
    fn = getattr(schedule.source, "op_arrays", None)
    if fn is None:
        return None
    out: OpArrays | None = fn(ranks)
    return out


def op_arrays_from_ops(per_rank: Sequence[Sequence[Op]], ranks: Sequence[int]) -> OpArrays | None:
    """The arrays of built op lists (one per rank of `ranks`); None where an op is not listed at
    (its rank, its index), which the arrays cannot say."""
    protos: dict[Proto, int] = {}
    proto: list[int] = []
    channel: list[int] = []
    count: list[int] = []
    ndeps: list[int] = []
    dep_rank: list[int] = []
    dep_index: list[int] = []
    for r, ops in zip(ranks, per_rank):
        for i, op in enumerate(ops):
            if op.index != i or op.rank != r:
                return None
            p = Proto(op.kind, r, op.dst.rank, tuple(s.rank for s in op.srcs), op.accumulate)
            pid = protos.get(p)
            if pid is None:
                pid = protos[p] = len(protos)
            proto.append(pid)
            channel.append(op.channel)
            count.append(op.dst.count)
            ndeps.append(len(op.deps))
            for dr, di in op.deps:
                dep_rank.append(dr)
                dep_index.append(di)
    dep_ptr = np.zeros(len(proto) + 1, np.int64)
    np.cumsum(np.array(ndeps, np.int64), out=dep_ptr[1:])
    return OpArrays(ranks=list(ranks), lens=np.array([len(ops) for ops in per_rank], np.int64),
                    protos=list(protos), proto=np.array(proto, np.int32),
                    channel=np.array(channel, np.int32), count=np.array(count, np.int64),
                    dep_ptr=dep_ptr, dep_rank=np.array(dep_rank, np.int32),
                    dep_index=np.array(dep_index, np.int32))


def concat(parts: Sequence[OpArrays]) -> OpArrays:
    """Per-rank (or per-block) arrays joined in order, prototypes renumbered."""
    protos: list[Proto] = []
    proto, ptrs = [], [np.zeros(1, np.int64)]
    base = 0
    for p in parts:
        proto.append((p.proto + len(protos)).astype(np.int32))
        protos.extend(p.protos)
        ptrs.append(p.dep_ptr[1:] + base)
        base += int(p.dep_ptr[-1])
    cat = np.concatenate
    return OpArrays(ranks=[r for p in parts for r in p.ranks], lens=cat([p.lens for p in parts]),
                    protos=protos, proto=cat(proto), channel=cat([p.channel for p in parts]),
                    count=cat([p.count for p in parts]), dep_ptr=cat(ptrs),
                    dep_rank=cat([p.dep_rank for p in parts]), dep_index=cat([p.dep_index for p in parts]))


def gather(blocks: Iterable[OpArrays], num_ops: int, max_deps: int) -> OpArrays:
    """Blocks (of consecutive ranks, in order) written into arrays sized up front, each block as
    it is produced: unlike `concat`, every block is not alive at once next to the joined copy
    (the peak memory of a 33M-op array form). `num_ops`: the blocks' rows in all; `max_deps`:
    at least their deps in all (the dep arrays are views of that much)."""
    proto, channel = np.empty(num_ops, np.int32), np.empty(num_ops, np.int32)
    count, dep_ptr = np.empty(num_ops, np.int64), np.zeros(num_ops + 1, np.int64)
    dep_rank, dep_index = np.empty(max_deps, np.int32), np.empty(max_deps, np.int32)
    ranks: list[int] = []
    lens: list[I64] = []
    protos: list[Proto] = []
    row = dep = 0
    for b in blocks:
        n, nd = b.num_ops, int(b.dep_ptr[-1])
        if row + n > num_ops or dep + nd > max_deps:
            raise ValueError("gather: the blocks hold more ops or deps than sized for")
        proto[row:row + n] = b.proto + len(protos)
        channel[row:row + n], count[row:row + n] = b.channel, b.count
        dep_ptr[row + 1:row + n + 1] = b.dep_ptr[1:] + dep
        dep_rank[dep:dep + nd], dep_index[dep:dep + nd] = b.dep_rank, b.dep_index
        protos.extend(b.protos)
        ranks.extend(b.ranks)
        lens.append(b.lens)
        row, dep = row + n, dep + nd
    if row != num_ops:
        raise ValueError("gather: the blocks hold fewer ops than sized for")
    return OpArrays(ranks=ranks, lens=np.concatenate(lens) if lens else np.zeros(0, np.int64),
                    protos=protos, proto=proto, channel=channel, count=count, dep_ptr=dep_ptr,
                    dep_rank=dep_rank[:dep], dep_index=dep_index[:dep])
