"""The algorithm interface, the per-plan context, and the lazy op source built from a recipe."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.errors import OpLimitError
from hiercoll.gcpause import without_cyclic_gc
from hiercoll.planner.builder import RankBuilder
from hiercoll.planner.labels import Label
from hiercoll.schedule import INPUT, OUTPUT, Op, Region, SymmetryGroup
from hiercoll.schedule_arrays import OpArrays
from hiercoll.topology import Topology


class BaseParams(BaseModel):
    """Knobs every algorithm has; algorithms extend this model with their own."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    chunks: int = Field(default=1, ge=1, le=64, description="pieces per block, pipelined")
    channels: int = Field(default=1, ge=1, le=16, description="parallel op streams per rank")


ParamsT = TypeVar("ParamsT", bound=BaseParams)


class Algorithm(ABC, Generic[ParamsT]):
    """A schedule generator. Subclasses build one rank at a time.

    A subclass names its parameter model twice, as the type argument (`Algorithm[HierParams]`,
    so its methods see `ctx.params: HierParams`) and as `Params` (the class that validates it)."""

    name: ClassVar[str]
    kinds: ClassVar[frozenset[Kind]]
    Params: type[ParamsT]     # a class attribute (ClassVar cannot hold a type variable)
    # True when channels only spread chunks (chunk c on channel c % channels), so more channels
    # than chunks change nothing; the ring gives every channel its own slice instead.
    channels_carry_chunks: ClassVar[bool] = True
    # True when the swizzled node order walks per-level offsets on a tiered fabric (node a's
    # k-th target adds k's mixed-radix digits to a's, level by level: hier.common.Place), which
    # keeps the plan symmetric under level shifts (sim/symmetry.py) instead of node shifts.
    level_node_orders: ClassVar[bool] = False

    def unsupported(self, topo: Topology, spec: CollectiveSpec, params: ParamsT) -> str | None:
        """Why this algorithm cannot plan this case, or None."""
        if spec.kind not in self.kinds:
            return f"{self.name} does not implement {spec.kind} (it does {', '.join(sorted(self.kinds))})"
        return None

    @abstractmethod
    def build_rank(self, ctx: PlanContext[ParamsT], b: RankBuilder) -> None:
        """Emit rank `b.rank`'s ops in order, labelling those that peers depend on."""

    def symmetry_period(self, ctx: PlanContext[ParamsT]) -> int | None:
        """P such that rank r+P runs rank r's program shifted by P, or None. Rank-relative
        recipes on identical nodes have P = gpus_per_node; the simulator checks the claim."""
        return None

    def peers_per_rank(self, topology: Topology, spec: CollectiveSpec, params: ParamsT) -> int:
        """About how many transfers one rank makes per chunk and channel, from sizes alone
        (registry.estimate_ops, the op limit's estimate: never below what is built). Flat
        families exchange with every other rank."""
        return spec.world_size

    # "xor": symmetry_period's P means rank r xor kP runs rank r's program with every rank
    # xor-ed by kP (pairwise exchanges at power-of-two distances), not shifted
    symmetry_group: ClassVar[SymmetryGroup] = "shift"

    def index_of(self, ctx: PlanContext[ParamsT], rank: int, label: Label) -> int:
        """Index of the op labelled `label` on `rank`; override with a formula for scale."""
        return ctx.label_map(rank)[label]

    def op_arrays(self, ctx: PlanContext[ParamsT], ranks: Sequence[int]) -> OpArrays | None:
        """`ranks`' ops written straight as arrays (no `Op` per op: what a large simulation
        reads), exactly what `build_rank` builds; None where the family has no such form (the
        simulator then converts built ops)."""
        return None


@dataclass
class PlanContext(Generic[ParamsT]):
    """One plan being built: `params` is the algorithm's own model (`Algorithm[ParamsT]`)."""

    topology: Topology
    spec: CollectiveSpec
    params: ParamsT
    algorithm: Algorithm[ParamsT]
    _labels: OrderedDict[int, dict[Label, int]] = field(default_factory=OrderedDict, repr=False)
    # tables every rank's build reads that depend on the whole plan (group layouts' relay
    # slots): computed once per plan, in one pass, not once per rank built
    memo: dict[str, Any] = field(default_factory=dict, repr=False)
    _label_count: int = field(default=0, repr=False)
    # ranks label_map built and `build` has not finished yet (their ops and labels), newest
    # last: an unfolded simulation asks each peer's labels before building that peer, and
    # building a group_cast rank twice was half of planning it
    _unfinished: OrderedDict[int, RankBuilder] = field(default_factory=OrderedDict, repr=False)
    _unfinished_ops: int = field(default=0, repr=False)

    @property
    def world(self) -> int:
        return self.spec.world_size

    def input(self, rank: int, offset: int, count: int) -> Region:
        return Region(rank, INPUT, offset, count)

    def output(self, rank: int, offset: int, count: int) -> Region:
        return Region(rank, OUTPUT, offset, count)

    def new_builder(self, rank: int) -> RankBuilder:
        b = RankBuilder(self.topology, rank)
        b.alloc(INPUT, self.spec.input_count(rank))
        b.alloc(OUTPUT, self.spec.output_count(rank))
        return b

    def label_map(self, rank: int) -> dict[Label, int]:
        """Labels of `rank`'s ops (builds that rank without resolving its deps; LRU-cached)."""
        if rank in self._labels:
            self._labels.move_to_end(rank)
            return self._labels[rank]
        b = self.new_builder(rank)
        with without_cyclic_gc():
            self.algorithm.build_rank(self, b)
        self._keep_labels(rank, b.labels)
        self._unfinished[rank] = b
        self._unfinished_ops += len(b.ops)
        while len(self._unfinished) > 1 and self._unfinished_ops > UNFINISHED_OPS_HELD:
            self._unfinished_ops -= len(self._unfinished.popitem(last=False)[1].ops)
        return b.labels

    def _keep_labels(self, rank: int, labels: dict[Label, int]) -> None:
        """Cache a rank's labels, bounded by labels held, not ranks: a group layout's ranks
        each carry a few labels, and resolving W ranks' deps on random peers through a 256-rank
        LRU rebuilt each peer ~W/256 times."""
        old = self._labels.pop(rank, None)
        if old is not None:
            self._label_count -= len(old)
        self._labels[rank] = labels
        self._label_count += len(labels)
        while len(self._labels) > 256 and self._label_count > LABELS_HELD:
            self._label_count -= len(self._labels.popitem(last=False)[1])

    def build(self, rank: int) -> tuple[list[Op], dict[str, int]]:
        """One rank's ops. The cyclic GC waits meanwhile: a rank is thousands of acyclic
        objects, and a collection rescans every op already held (over half of building a
        4096-rank ring's ranks). A rank label_map built is finished, not built again (a build
        is a pure function of the plan and the rank), and a rank built here keeps its labels
        for the peers that resolve them later."""
        b = self._unfinished.pop(rank, None)
        with without_cyclic_gc():
            if b is None:
                b = self.new_builder(rank)
                self.algorithm.build_rank(self, b)
                if rank not in self._labels:
                    self._keep_labels(rank, b.labels)
            else:
                self._unfinished_ops -= len(b.ops)
            ops = b.finish(lambda r, label: self.algorithm.index_of(self, r, label))
        return ops, b.buffers


LABELS_HELD = 1 << 20     # label maps kept (their labels in total) beyond the last 256 ranks
UNFINISHED_OPS_HELD = 1 << 22   # ops of ranks label_map built, kept for their own build
OPS_HELD = 1 << 22        # ops a recipe keeps built beyond its LRU size once it sees a re-scan


@dataclass(frozen=True)
class OpBudget:
    """How many of a plan's ranks may be built under the op limit (HIERCOLL_MAX_OPS), from the
    planner's estimate: a plan too large to build whole can still be simulated where the
    simulation folds (it builds one node's or one period's ranks), so the limit applies to
    what a consumer walks, not to planning."""

    ranks: int             # most ranks one walk may cover (>= 1: else plan() refuses)
    message: str           # "size: ... above the limit ..." (the reason, without the fix)

    def check(self, ranks: int, what: str) -> None:
        if ranks > self.ranks:
            raise OpLimitError(f"{self.message} for {what} (it builds {ranks} ranks' ops; at "
                                f"most {self.ranks} fit); use fewer ranks/chunks/channels or a "
                                "hierarchical algorithm, simulate it folded (`mode=\"auto\"` on a "
                                "symmetric topology builds one node's or one period's ranks), "
                                "or raise HIERCOLL_MAX_OPS")


class RecipeOps(Generic[ParamsT]):
    """OpSource that builds each rank's ops from the recipe on demand (LRU cache).

    The cache starts small (`cache` ranks) and grows to every rank once a rank built before is
    asked for again after being dropped: a consumer that walks every rank more than once (an unfolded
    simulation: timing, predecessors, op counts, host launches) then builds each rank once,
    not once per walk; OPS_HELD bounds what that keeps. `budget`: how many ranks a walk may
    cover (`check_walk`, which every consumer that walks all ranks calls first; a symmetry check
    or a folded simulation builds a few, and the cache never holds more than OPS_HELD ops)."""

    def __init__(self, ctx: PlanContext[ParamsT], cache: int = 64, budget: OpBudget | None = None):
        self.ctx = ctx
        self.budget = budget
        self._cache: OrderedDict[int, tuple[list[Op], dict[str, int]]] = OrderedDict()
        self._size = cache
        self._built: set[int] = set()
        self._held = 0          # ops in the cache

    def _get(self, rank: int) -> tuple[list[Op], dict[str, int]]:
        hit = self._cache.get(rank)
        if hit is not None:
            self._cache.move_to_end(rank)
            return hit
        if rank in self._built:          # dropped and asked for again: a re-scan
            self._size = self.ctx.world
        self._built.add(rank)
        built = self.ctx.build(rank)
        self._cache[rank] = built
        self._held += len(built[0])
        while len(self._cache) > 1 and (len(self._cache) > self._size or self._held > OPS_HELD):
            self._held -= len(self._cache.popitem(last=False)[1][0])
        return built

    def rank_ops(self, rank: int) -> Sequence[Op]:
        return self._get(rank)[0]

    def rank_buffers(self, rank: int) -> dict[str, int]:
        return self._get(rank)[1]

    def op_arrays(self, ranks: Sequence[int]) -> OpArrays | None:
        """The algorithm's array form of `ranks`' ops, if it has one (nothing is cached: a
        simulation asks once). None too where a size does not fit the arrays' int64 (a plan
        file's junk, say): the built ops carry Python ints, and their checks say what is wrong."""
        try:
            return self.ctx.algorithm.op_arrays(self.ctx, ranks)
        except OverflowError:
            return None

    def check_walk(self, ranks: int, what: str) -> None:
        if self.budget is not None:
            self.budget.check(ranks, what)


def params_dict(params: BaseParams) -> dict[str, Any]:
    return params.model_dump(mode="json")


def node_period(ctx: PlanContext[ParamsT], *switches: bool) -> int | None:
    """gpus_per_node when every visiting order is rank-relative (all `switches` on) and the
    collective has no distinguished rank; what most algorithms return from symmetry_period."""
    if ctx.spec.kind not in TRANSLATION_INVARIANT or not all(switches):
        return None
    return ctx.topology.gpus_per_node


def xor_period(ctx: PlanContext[ParamsT]) -> int | None:
    """gpus_per_node for pairwise exchanges at power-of-two distances (rank r pairs with r xor
    2^t): with a power-of-two world and node size, xor-ing every rank by a multiple of the node
    size maps nodes onto nodes and each pair onto a pair. What the recipe moves must map too:
    a recipe that moves shards checks they are one size (rhd: `rank_relative`)."""
    w, g = ctx.world, ctx.topology.gpus_per_node
    if ctx.spec.kind not in TRANSLATION_INVARIANT or w & (w - 1) or g & (g - 1):
        return None
    return g


TRANSLATION_INVARIANT = frozenset({Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE,
                                   Kind.ALL_TO_ALL})
