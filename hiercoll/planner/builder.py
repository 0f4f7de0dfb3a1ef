"""Building one rank's op list. The builder owns index allocation (no globals), so algorithms can
produce any rank on its own: dependencies on peers name a *label* that the peer's recipe also
gives its op (labels.py: one NamedTuple per family); labels resolve to indices through the
algorithm (by formula, or by building the peer's label map, which never needs our own)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hiercoll.collectives import CollectiveSpec, ReduceOp
from hiercoll.errors import ScheduleError
from hiercoll.planner.labels import Label
from hiercoll.schedule import Op, OpKind, OpRef, Region, Transport
from hiercoll.topology import Topology

Resolver = Callable[[int, Label], int]   # (peer rank, label) -> index of that op on the peer


def avg_scale(spec: CollectiveSpec, terms: int) -> float:
    """The scale a reduce of `terms` inputs applies for `spec`'s op: 1/terms for avg (applied
    once, where all terms meet), 1 otherwise."""
    return 1.0 / terms if spec.reduce_op == ReduceOp.AVG else 1.0


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


def swizzled_peers(rank: int, world: int, swizzle: bool, include_self: bool = False, *,
                   gpus: int = 1) -> list[int]:
    """Peer visiting order of a fan-out (every rank sends to every peer).

    Swizzled and node-aware (`gpus` = GPUs per node): local rank l of node n first visits its
    node's peers l+1, l+2, ..., then the remote nodes starting at node n+1+l (mod the N-1 remote
    nodes), each from its own rail (remote local rank l, l+1, ...). Every step is a permutation
    (one writer per destination), and the GPUs of a node spread their first inter-node puts over
    different remote nodes and rails. Without the node term (rank+1, rank+2, ... over all ranks)
    every GPU of a node reaches the same remote GPU first after its fast NVLink steps, and the
    2x8 all-to-all ran 3-4x slower in the simulator. gpus=1 is the flat rank+1, rank+2, ...
    Plain (swizzle off): 0, 1, 2, ... (everyone hits rank 0 first)."""
    if not swizzle:
        return [p for p in range(world) if include_self or p != rank]
    g = gpus if gpus >= 1 and world % gpus == 0 else 1
    nodes, (n, l) = world // g, divmod(rank, g)
    order = [n * g + (l + k) % g for k in range(0 if include_self else 1, g)]
    for j in range(nodes - 1):
        t = (n + 1 + (l + j) % (nodes - 1)) % nodes
        order += [t * g + (l + d) % g for d in range(g)]
    return order


def peer_position(rank: int, peer: int, world: int, swizzle: bool, include_self: bool = False, *,
                  gpus: int = 1) -> int:
    """Index of `peer` in `swizzled_peers(rank, ...)`, by formula (no list)."""
    if not swizzle:
        if include_self:
            return peer
        return peer if peer < rank else peer - 1
    g = gpus if gpus >= 1 and world % gpus == 0 else 1
    nodes, (n, l), (t, m) = world // g, divmod(rank, g), divmod(peer, g)
    base = 0 if include_self else -1
    if t == n:
        return base + (m - l) % g
    j = ((t - n - 1) % nodes - l) % (nodes - 1)
    return base + g + j * g + (m - l) % g


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
