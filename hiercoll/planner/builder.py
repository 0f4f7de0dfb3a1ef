"""Building one rank's op list. The builder owns index allocation (no globals), so algorithms can
produce any rank on its own: dependencies on peers name a *label* that the peer's recipe also
gives its op (labels.py: one NamedTuple per family); labels resolve to indices through the
algorithm (by formula, or by building the peer's label map, which never needs our own)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hiercoll.errors import ScheduleError
from hiercoll.planner.labels import Label
from hiercoll.schedule import Op, OpKind, OpRef, Region, Transport
from hiercoll.topology import Topology

Resolver = Callable[[int, Label], int]   # (peer rank, label) -> index of that op on the peer


@dataclass(frozen=True, slots=True)
class Dep:
    """A dependency on the op labelled `label` on `rank` (possibly our own)."""

    rank: int
    label: Label


@dataclass(slots=True, kw_only=True)
class _Pending:
    channel: int
    kind: OpKind
    dst: Region
    srcs: tuple[Region, ...]
    deps: tuple[Dep | int, ...]
    accumulate: bool
    scale: float


def transport_between(topo: Topology, a: int, b: int) -> Transport:
    if a == b:
        return Transport.LOCAL
    return Transport.INTRA if topo.same_node(a, b) else Transport.INTER


def op_transport(topo: Topology, dst: Region, srcs: Sequence[Region]) -> Transport:
    """The widest tier any source-to-destination movement of the op crosses (hot: one call
    per op of every planned rank, hence no helper calls)."""
    g, d = topo.gpus_per_node, dst.rank
    tier = Transport.LOCAL
    for s in srcs:
        if s.rank != d:
            if s.rank // g != d // g:
                return Transport.INTER
            tier = Transport.INTRA
    return tier


@dataclass
class RankBuilder:
    topology: Topology
    rank: int
    ops: list[_Pending] = field(default_factory=list)
    labels: dict[Label, int] = field(default_factory=dict)
    buffers: dict[str, int] = field(default_factory=dict)

    def alloc(self, name: str, count: int) -> None:
        """Declare a buffer of this rank (input/output sizes come from the spec)."""
        self.buffers[name] = max(self.buffers.get(name, 0), count)

    def _emit(self, p: _Pending, label: Label | None) -> int:
        index = len(self.ops)
        self.ops.append(p)
        if label is not None:
            assert label not in self.labels, f"rank {self.rank}: label {label!r} used twice"
            self.labels[label] = index
        return index

    def copy(self, src: Region, dst: Region, *, channel: int = 0,
             deps: Sequence[Dep | int] = (), label: Label | None = None) -> int:
        assert src.count == dst.count, (src, dst)
        return self._emit(_Pending(channel=channel, kind=OpKind.COPY, dst=dst, srcs=(src,),
                                   deps=tuple(deps), accumulate=False, scale=1.0), label)

    def reduce(self, srcs: Sequence[Region], dst: Region, *, accumulate: bool = False,
               scale: float = 1.0, channel: int = 0, deps: Sequence[Dep | int] = (),
               label: Label | None = None) -> int:
        """dst <- [dst +] scale * (+ srcs). A lone source with nothing to fold in is a copy."""
        if not srcs:    # a planner bug, caught where it is made rather than in an executor
            raise ScheduleError(f"rank {self.rank}: a reduce into {dst} with no sources")
        if len(srcs) == 1 and not accumulate and scale == 1.0:
            return self.copy(srcs[0], dst, channel=channel, deps=deps, label=label)
        return self._emit(_Pending(channel=channel, kind=OpKind.REDUCE, dst=dst, srcs=tuple(srcs),
                                   deps=tuple(deps), accumulate=accumulate, scale=scale), label)

    def finish(self, resolve: Resolver) -> list[Op]:
        """Resolve labels to indices and freeze the ops (hot: one call per planned rank)."""
        out = []
        rank, labels, topo = self.rank, self.labels, self.topology
        for i, p in enumerate(self.ops):
            refs: list[OpRef] = []
            for d in p.deps:
                if isinstance(d, int):
                    refs.append((rank, d))
                elif d.rank == rank:
                    refs.append((rank, labels[d.label]))
                else:
                    refs.append((d.rank, resolve(d.rank, d.label)))
            deps = tuple(dict.fromkeys(refs)) if len(refs) > 1 else tuple(refs)
            out.append(Op(rank=rank, index=i, channel=p.channel, kind=p.kind, dst=p.dst,
                          srcs=p.srcs, deps=deps, transport=op_transport(topo, p.dst, p.srcs),
                          accumulate=p.accumulate, scale=p.scale))
        return out


def chunk_bounds(count: int, chunks: int, c: int) -> tuple[int, int]:
    """(offset, count) of chunk c of `count` elements split into `chunks` balanced pieces."""
    base, extra = divmod(count, chunks)
    return c * base + min(c, extra), base + (1 if c < extra else 0)


def swizzled_peers(rank: int, world: int, swizzle: bool, include_self: bool = False) -> list[int]:
    """Peer visiting order. Swizzled: rank+1, rank+2, ... so that at every step each rank
    targets a different peer (balanced ports); plain: 0, 1, 2, ... (everyone hits rank 0 first)."""
    if swizzle:
        order = [(rank + k) % world for k in range(1, world)]
        return ([rank] + order) if include_self else order
    return [p for p in range(world) if include_self or p != rank]


def peer_position(rank: int, peer: int, world: int, swizzle: bool, include_self: bool = False) -> int:
    """Index of `peer` in `swizzled_peers(rank, ...)`, by formula (no list)."""
    if swizzle:
        k = (peer - rank) % world
        return k if include_self else k - 1
    if include_self:
        return peer
    return peer if peer < rank else peer - 1


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
