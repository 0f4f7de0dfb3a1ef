"""Name -> algorithm, and `plan()`: validated parameters in, a (lazy) Schedule out."""

from __future__ import annotations

import os
from typing import Any

from pydantic import ValidationError

from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.planner.bruck import Bruck
from hiercoll.planner.context import Algorithm, BaseParams, OpBudget, ParamsT, PlanContext, RecipeOps, params_dict
from hiercoll.planner.direct import Direct
from hiercoll.planner.halving_doubling import HalvingDoubling
from hiercoll.planner.hier.hier import Hier
from hiercoll.planner.hier.hier_2d import Hier2D
from hiercoll.planner.hier.tiers import HierTiers
from hiercoll.planner.recursive_doubling import RecursiveDoubling
from hiercoll.planner.ring import Ring
from hiercoll.planner.tree import Tree
from hiercoll.planner.two_shot import TwoShot
from hiercoll.schedule import Schedule, ScheduleMeta
from hiercoll.topology import Topology

# each algorithm has its own params model: the registry holds them all, whatever their model
_REGISTRY: dict[str, Algorithm[Any]] = {}


def register(algo: Algorithm[ParamsT]) -> Algorithm[ParamsT]:
    _REGISTRY[algo.name] = algo
    return algo


_BUILT_IN: tuple[Algorithm[Any], ...] = (Ring(), Direct(), TwoShot(), Hier(), Hier2D(), HierTiers(),
                                        Tree(), HalvingDoubling(), RecursiveDoubling(), Bruck())
for _algo in _BUILT_IN:
    register(_algo)


def algorithms() -> dict[str, Algorithm[Any]]:
    return dict(_REGISTRY)


def get_algorithm(name: str) -> Algorithm[Any]:
    if name not in _REGISTRY:
        raise HiercollError(f"--algorithm: unknown {name!r}; choose one of "
                            f"{', '.join(sorted(_REGISTRY))}, nccl (one library call) or auto")
    return _REGISTRY[name]


def parse_params(algo: Algorithm[ParamsT], params: dict[str, Any] | BaseParams | None) -> ParamsT:
    """`algo`'s params model from key=values (validated), or the model itself. A params model of
    another algorithm is re-validated as this one's (its fields must fit)."""
    if isinstance(params, algo.Params):
        return params
    if isinstance(params, BaseParams):
        params = params.model_dump()
    try:
        return algo.Params.model_validate(params or {})
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "extra_forbidden":
            raise HiercollError(f"--param ({algo.name}): {first['loc'][0]}: unknown field; "
                                f"{algo.name} takes {describe_params(algo)} (see `hiercoll "
                                "algorithms`)") from None
        raise HiercollError(format_validation_error(err, f"--param ({algo.name})")) from None


def param_defaults(algo: Algorithm[Any]) -> dict[str, Any]:
    """Every parameter `algo` takes, with its default (what `-p` may set)."""
    return {name: f.default for name, f in algo.Params.model_fields.items()}


def describe_params(algo: Algorithm[Any]) -> str:
    """`chunks=1, channels=1, ...`: the parameters with their defaults, for one-line messages."""
    return ", ".join(f"{k}={'(topology)' if v is None else v}" for k, v in param_defaults(algo).items())


def applicable(topology: Topology, spec: CollectiveSpec) -> list[str]:
    """Names of algorithms that can plan `spec` on `topology` with default parameters."""
    return [n for n, a in sorted(_REGISTRY.items())
            if a.unsupported(topology, spec, a.Params()) is None]


def plan(topology: Topology, spec: CollectiveSpec, algorithm: str,
         params: dict[str, Any] | BaseParams | None = None) -> Schedule:
    """A lazy schedule: each rank's ops are built when first asked for (`.expand()` for all).
    `nccl` is the library pseudo-algorithm: no ops, the executor makes one library call."""
    from hiercoll.planner.search.library import LIBRARY, library_schedule
    if algorithm == LIBRARY:
        return library_schedule(topology, spec)
    return _plan(topology, spec, get_algorithm(algorithm), params)


MAX_OPS_ENV = "HIERCOLL_MAX_OPS"
DEFAULT_MAX_OPS = 200_000_000     # ~60 GB expanded; a 4096-GPU ring all-reduce is ~33 M ops
BYTES_PER_OP = 300                # an expanded Op with its regions and deps, roughly


def estimate_ops(topology: Topology, spec: CollectiveSpec, algo: Algorithm[Any],
                 params: BaseParams) -> int:
    """An upper-ish estimate of the plan's op count, from sizes alone (nothing is built): per
    rank ~2 steps per peer it exchanges with (the family's `peers_per_rank`), times chunks and
    channels (tests/test_autopick_speed.py checks it against the ops built)."""
    world = max(spec.world_size, 1)
    chunks = max(int(getattr(params, "chunks", 1) or 1), 1)
    channels = max(int(getattr(params, "channels", 1) or 1), 1)
    peers = algo.peers_per_rank(topology, spec, params)
    return world * 2 * max(peers, 2) * chunks * channels     # + a local copy or two per rank


def max_ops() -> int:
    raw = os.environ.get(MAX_OPS_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_OPS
    try:
        value = int(float(raw))
    except (ValueError, OverflowError):      # 'abc'; 'inf' and '1e400' (float inf) overflow int
        raise HiercollError(f"{MAX_OPS_ENV}: {raw!r} should be a finite number of ops, e.g. "
                            f"{DEFAULT_MAX_OPS}") from None
    if value < 1:
        raise HiercollError(f"{MAX_OPS_ENV}: {raw!r} should be >= 1")
    return value


def op_budget(topology: Topology, spec: CollectiveSpec, algo: Algorithm[Any],
              params: BaseParams) -> OpBudget | None:
    """None when the whole plan fits HIERCOLL_MAX_OPS; else how many ranks may be built. One
    line, before anything is built, when not even one rank fits."""
    ops, limit = estimate_ops(topology, spec, algo, params), max_ops()
    if ops <= limit:
        return None
    gib = ops * BYTES_PER_OP / 2**30
    why = (f"size: {algo.name} {spec.kind.value} on {spec.world_size} ranks would be about "
           f"{ops:.3g} ops (~{gib:.3g} GiB expanded), above the limit of {limit:.3g} "
           f"({MAX_OPS_ENV})")
    ranks = limit // max(ops // max(spec.world_size, 1), 1)
    if ranks < 1:
        raise HiercollError(f"{why}: not even one rank's ops fit; use fewer ranks/chunks/channels "
                            f"or a hierarchical algorithm, or raise {MAX_OPS_ENV}")
    return OpBudget(ranks, why)


def _plan(topology: Topology, spec: CollectiveSpec, algo: Algorithm[ParamsT],
          params: dict[str, Any] | BaseParams | None) -> Schedule:
    p = parse_params(algo, params)
    if spec.world_size != topology.world_size:
        raise HiercollError(f"world size: the spec has {spec.world_size} ranks, topology "
                            f"{topology.name} has {topology.world_size}")
    budget = op_budget(topology, spec, algo, p)
    why = algo.unsupported(topology, spec, p)
    if why:
        raise HiercollError(f"--algorithm {algo.name}: {why}")
    ctx = PlanContext(topology, spec, p, algo)
    meta = ScheduleMeta(algo.name, params_dict(p), spec, topology.fingerprint(),
                        symmetry_period=algo.symmetry_period(ctx), symmetry_group=algo.symmetry_group)
    return Schedule(meta, RecipeOps(ctx, budget=budget))
