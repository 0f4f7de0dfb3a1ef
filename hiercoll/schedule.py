"""The schedule IR: per-rank buffers and ops with explicit dependencies.

Imported by planner, sim and executor; imports none of them. A schedule is concrete in elements.
Ops are identified by (rank, index): `index` is the op's position in its rank's list, so a rank's
list can be produced on its own (lazily, from an algorithm's recipe) and dependencies on other
ranks' ops are plain coordinates. Ops of one (rank, channel) run in index order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol

from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError, ScheduleError

SCHEMA_VERSION = 1
# how a declared symmetry_period maps ranks: r -> r + kP, or r -> r xor kP
SymmetryGroup = Literal["shift", "xor"]
INPUT, OUTPUT = "input", "output"
LIBRARY_ALGORITHM = "nccl"   # the pseudo-algorithm: one library call, no ops


class OpKind(StrEnum):
    COPY = "copy"       # dst <- src; either side may live on a peer (put or get)
    REDUCE = "reduce"   # dst <- [dst (+)] scale * (src_0 (+) src_1 ...), elementwise


class Transport(StrEnum):
    """The widest tier an op's data crosses; derived from the topology when the op is built."""

    LOCAL = "local"
    INTRA = "intra"     # NVLink / xGMI / PCIe inside a node
    INTER = "inter"     # RDMA between nodes


@dataclass(frozen=True, slots=True)
class Region:
    """`count` elements at `offset` of buffer `buffer` on rank `rank`."""

    rank: int
    buffer: str
    offset: int
    count: int

    def overlaps(self, other: Region) -> bool:
        return (self.rank == other.rank and self.buffer == other.buffer
                and self.offset < other.offset + other.count
                and other.offset < self.offset + self.count)

    def sub(self, offset: int, count: int) -> Region:
        return Region(self.rank, self.buffer, self.offset + offset, count)

    def to_json(self) -> list[Any]:
        return [self.rank, self.buffer, self.offset, self.count]

    def __str__(self) -> str:
        return f"r{self.rank}.{self.buffer}[{self.offset}:{self.offset + self.count}]"


OpRef = tuple[int, int]  # (rank, index)


@dataclass(frozen=True, slots=True)
class Op:
    rank: int                      # the rank that issues (executes) the op
    index: int                     # position in that rank's op list
    channel: int                   # ops of one (rank, channel) run in order
    kind: OpKind
    dst: Region
    srcs: tuple[Region, ...]
    deps: tuple[OpRef, ...] = ()   # ops (any rank) that must finish first
    transport: Transport = Transport.LOCAL
    accumulate: bool = False       # reduce: fold dst's current value in
    scale: float = 1.0             # reduce: multiply the combined sources (avg)

    @property
    def id(self) -> str:
        return f"{self.rank}.{self.index}"

    @property
    def ref(self) -> OpRef:
        return (self.rank, self.index)

    def reads(self) -> tuple[Region, ...]:
        return self.srcs + ((self.dst,) if self.accumulate else ())

    @property
    def relayed(self) -> bool:
        """A copy issued by a rank that is neither of its ends (copy forwarding makes them: a
        rank's push of what it received becomes its pull from the first sender). Over peer
        mappings its bytes pass through the issuer's SMs: a read over one link, a store over
        another."""
        return self.kind == OpKind.COPY and self.rank not in (self.srcs[0].rank, self.dst.rank)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "ch": self.channel, "kind": self.kind.value,
                             "dst": self.dst.to_json(), "srcs": [s.to_json() for s in self.srcs],
                             "deps": [list(x) for x in self.deps], "transport": self.transport.value}
        if self.accumulate:
            d["acc"] = True
        if self.scale != 1.0:
            d["scale"] = self.scale
        return d

    def describe(self) -> str:
        srcs = ", ".join(str(s) for s in self.srcs)
        acc = " (+=)" if self.accumulate else ""
        return f"op {self.id} [{self.kind.value}, ch{self.channel}, {self.transport.value}] {srcs} -> {self.dst}{acc}"


class OpSource(Protocol):
    """Where a schedule's ops come from: stored lists, or an algorithm's recipe (lazy)."""

    def rank_ops(self, rank: int) -> Sequence[Op]: ...

    def rank_buffers(self, rank: int) -> dict[str, int]: ...

    def check_walk(self, ranks: int, what: str) -> None:
        """Raise one line if building `ranks` ranks' ops would cross the op limit."""


@dataclass(frozen=True)
class ExpandedOps:
    ops: tuple[tuple[Op, ...], ...]
    buffers: tuple[dict[str, int], ...]

    def rank_ops(self, rank: int) -> Sequence[Op]:
        return self.ops[rank]

    def rank_buffers(self, rank: int) -> dict[str, int]:
        return self.buffers[rank]

    def check_walk(self, ranks: int, what: str) -> None:
        """Already built: nothing to refuse."""


@dataclass(frozen=True)
class ScheduleMeta:
    algorithm: str
    params: dict[str, Any]
    spec: CollectiveSpec
    topology_fingerprint: str
    schema_version: int = SCHEMA_VERSION
    # ranks r and r+P run the same program shifted by P (declared by the algorithm, checked by
    # the simulator before it simulates one representative per orbit); None: no such claim.
    # symmetry_group "xor": ranks r and r xor kP instead (recursive doubling / halving pairs)
    symmetry_period: int | None = None
    symmetry_group: SymmetryGroup = "shift"

    def to_json(self) -> dict[str, Any]:
        d = {"algorithm": self.algorithm, "params": self.params,
             "spec": self.spec.model_dump(mode="json", exclude_none=True),
             "topology_fingerprint": self.topology_fingerprint,
             "schema_version": self.schema_version}
        if self.symmetry_period is not None:
            d["symmetry_period"] = self.symmetry_period
        if self.symmetry_group != "shift":
            d["symmetry_group"] = self.symmetry_group
        return d


@dataclass(frozen=True, eq=False)
class Schedule:
    """One collective on one topology. `source` yields each rank's ops on demand."""

    meta: ScheduleMeta
    source: OpSource = field(repr=False)

    @property
    def spec(self) -> CollectiveSpec:
        return self.meta.spec

    @property
    def world_size(self) -> int:
        return self.meta.spec.world_size

    @property
    def is_expanded(self) -> bool:
        return isinstance(self.source, ExpandedOps)

    @property
    def is_library_call(self) -> bool:
        """A plan with no ops that executors run as one collective-library call."""
        return self.meta.algorithm == LIBRARY_ALGORITHM

    def refuse_library_call(self, what: str) -> None:
        """One clear line instead of simulating or checking a plan that has nothing in it."""
        if self.is_library_call:
            raise HiercollError(f"{what}: this plan is one {LIBRARY_ALGORITHM} library call and "
                                "has no ops to model; its time comes from measurements "
                                "(autopick --library-table); run it with `hiercoll run`")

    def rank_ops(self, rank: int) -> Sequence[Op]:
        return self.source.rank_ops(rank)

    def check_walk(self, what: str, ranks: int | None = None) -> None:
        """Before walking `ranks` ranks (default: every rank): one clear line when building their
        ops would cross the planner's op limit (HIERCOLL_MAX_OPS), instead of running out of
        memory later. A plan too large to walk whole may still be simulated where it folds."""
        self.source.check_walk(self.world_size if ranks is None else ranks, what)

    def buffers(self, rank: int) -> dict[str, int]:
        return self.source.rank_buffers(rank)

    def ops(self) -> Iterator[Op]:
        self.check_walk("reading every op")
        for r in range(self.world_size):
            yield from self.rank_ops(r)

    def op(self, ref: OpRef) -> Op:
        return self.rank_ops(ref[0])[ref[1]]

    @property
    def num_ops(self) -> int:
        self.check_walk("counting its ops")
        return sum(len(self.rank_ops(r)) for r in range(self.world_size))

    def expand(self) -> Schedule:
        """The same schedule with every rank's ops materialised (for saving or many passes)."""
        if self.is_expanded:
            return self
        self.check_walk("expanding it")
        src = ExpandedOps(tuple(tuple(self.rank_ops(r)) for r in range(self.world_size)),
                          tuple(dict(self.buffers(r)) for r in range(self.world_size)))
        return Schedule(self.meta, src)

    # ---- JSON --------------------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        self.check_walk("saving it")
        return {"form": "expanded", "meta": self.meta.to_json(),
                "ranks": [{"buffers": dict(sorted(self.buffers(r).items())),
                           "ops": [o.to_json() for o in self.rank_ops(r)]}
                          for r in range(self.world_size)]}

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """Content hash of the expanded schedule (stable: sorted-key JSON)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    # equal by content; defining __eq__ leaves __hash__ None (Python's rule, and eq=False keeps
    # the dataclass from adding one), so a schedule stays unhashable as before
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.to_json() == other.to_json()



# ---- structural validation --------------------------------------------------------------------
def validate_structure(schedule: Schedule) -> None:
    """Ids, bounds, buffer sizes against the spec, region sizes, and dependency cycles.

    Raises ScheduleError naming the first bad op. Linear in the number of ops.
    """
    spec, w = schedule.spec, schedule.world_size
    for r in range(w):
        bufs = schedule.buffers(r)
        for name, want in ((INPUT, spec.input_count(r)), (OUTPUT, spec.output_count(r))):
            if bufs.get(name) != want:
                raise ScheduleError(f"rank {r}: buffer {name!r} has {bufs.get(name)} elements, the "
                                    f"{spec.kind} spec needs {want}")
    for r in range(w):
        for i, op in enumerate(schedule.rank_ops(r)):
            _check_op(schedule, op, r, i)
    _check_acyclic(schedule)


def _check_op(schedule: Schedule, op: Op, rank: int, index: int) -> None:
    w = schedule.world_size
    if op.rank != rank or op.index != index:
        raise ScheduleError(f"op {op.id}: listed at position {index} of rank {rank}; ids must be "
                            "'rank.index' with index = position")
    if op.channel < 0:
        raise ScheduleError(f"op {op.id}: channel {op.channel} must be >= 0")
    if not op.srcs or (op.kind == OpKind.COPY and len(op.srcs) != 1):
        raise ScheduleError(f"op {op.id}: a {op.kind.value} needs "
                            f"{'exactly one source' if op.kind == OpKind.COPY else 'sources'}")
    if op.kind == OpKind.COPY and (op.accumulate or op.scale != 1.0):
        raise ScheduleError(f"op {op.id}: acc/scale only apply to reduce ops")
    for reg in (op.dst, *op.srcs):
        if not 0 <= reg.rank < w:
            raise ScheduleError(f"op {op.id}: region {reg} on rank outside 0..{w - 1}")
        size = schedule.buffers(reg.rank).get(reg.buffer)
        if size is None:
            raise ScheduleError(f"op {op.id}: rank {reg.rank} has no buffer {reg.buffer!r}")
        if reg.offset < 0 or reg.count < 0 or reg.offset + reg.count > size:
            raise ScheduleError(f"op {op.id}: region {reg} outside buffer {reg.buffer!r} "
                                f"of {size} elements")
        if reg.count != op.dst.count:
            raise ScheduleError(f"op {op.id}: region {reg} has {reg.count} elements, dst has "
                                f"{op.dst.count}")
    if op.dst.buffer == INPUT:
        raise ScheduleError(f"op {op.id}: writes the input buffer of rank {op.dst.rank}; "
                            "inputs are read-only")
    for dr, di in op.deps:
        if not 0 <= dr < w or not 0 <= di < len(schedule.rank_ops(dr)):
            raise ScheduleError(f"op {op.id}: depends on {dr}.{di}, which does not exist")


def topological_order(schedule: Schedule, pick: Callable[[int], int] | None = None) -> list[Op]:
    """A linear extension of (deps + channel order), by Kahn's algorithm.

    `pick(n)` chooses which of the n ready ops runs next (random for the reference executor,
    last-ready otherwise). Raises ScheduleError naming an op on a cycle if there is one.
    """
    schedule.check_walk("ordering its ops")
    lists = [schedule.rank_ops(r) for r in range(schedule.world_size)]
    return [lists[r][i] for r, i in kahn_order(predecessor_map(schedule), pick)]


def kahn_order(preds: Mapping[OpRef, Sequence[OpRef]],
               pick: Callable[[int], int] | None = None) -> list[OpRef]:
    """Every op of `preds` after all of its predecessors (Kahn's algorithm): the one topological
    sort, shared by the reference executor, the checker and the simulator's bounds."""
    indeg: dict[OpRef, int] = {}
    succ: dict[OpRef, list[OpRef]] = {}
    for ref, ps in preds.items():
        indeg[ref] = len(ps)
        for p in ps:
            succ.setdefault(p, []).append(ref)
    ready = [ref for ref, d in indeg.items() if d == 0]
    order: list[OpRef] = []
    while ready:
        if pick is not None:
            i = pick(len(ready))
            ready[i], ready[-1] = ready[-1], ready[i]
        ref = ready.pop()
        order.append(ref)
        for s in succ.get(ref, ()):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(order) != len(indeg):
        stuck = sorted(ref for ref, d in indeg.items() if d > 0)[0]
        raise ScheduleError(f"op {stuck[0]}.{stuck[1]}: on a dependency cycle (deps + channel "
                            "order); the schedule would deadlock")
    return order


def _check_acyclic(schedule: Schedule) -> None:
    topological_order(schedule)


def predecessor_map(schedule: Schedule, ranks: Iterable[int] | None = None,
                    fold: int | None = None) -> dict[OpRef, tuple[OpRef, ...]]:
    """Everything that must finish before each op: its deps and the previous op on its
    (rank, channel). The one definition of "ordered before" that every consumer uses.

    `ranks` limits it to some ranks' ops; `fold` maps a dependency on rank r to the same op of
    rank r % fold (a translation symmetry simulates only the representatives)."""
    preds: dict[OpRef, tuple[OpRef, ...]] = {}
    for r in range(schedule.world_size) if ranks is None else ranks:
        last: dict[int, OpRef] = {}
        for op in schedule.rank_ops(r):
            p = {(d[0] % fold, d[1]) for d in op.deps} if fold else set(op.deps)
            if op.channel in last:
                p.add(last[op.channel])
            last[op.channel] = op.ref
            preds[op.ref] = tuple(sorted(p))
    return preds
