"""Which schedules a stress or bench sweep runs: from a plan file, or planned per size from
(collective, topology, algorithms). No torch; shared by the stress and bench commands."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hiercoll.collectives import CollectiveSpec, DType, Kind, ReduceOp, valid_nbytes
from hiercoll.errors import HiercollError
from hiercoll.planner.search.library import LIBRARY, LIBRARY_KINDS
from hiercoll.schedule import Schedule


@dataclass(frozen=True)
class Case:
    algorithm: str
    schedule: Schedule
    topology_name: str


@dataclass(frozen=True)
class SweepRequest:
    """What to sweep: a plan file, or a collective (a comma list: several in one process, one
    start-up for a whole comparison) on a topology; `algorithms` (comma list,
    default: the plan's, or every applicable one plus the library), `dtype`/`reduce_op`
    overriding the plan's or the default (bf16, sum), `sizes` (S in bytes; None: the plan's)."""

    plan: str | None = None
    collective: str | None = None
    topology: str | None = None
    nodes: int | None = None
    algorithms: str | None = None
    dtype: str | None = None
    reduce_op: str | None = None
    sizes: list[int] | None = None


def cases_for(req: SweepRequest, only_applicable: bool = False) -> list[Case]:
    """One case per (collective, algorithm, size), every rank building the same list."""
    from hiercoll.planner import applicable, plan
    kinds = _split(req.collective or "")
    if not req.plan and len(kinds) > 1:
        # a comparison over several collectives: a named algorithm runs where it applies
        # (hier_2d has no all-to-all), and one that applies to none of them is refused
        every = [c for kind in kinds
                 for c in cases_for(replace(req, collective=kind), only_applicable=True)]
        ran = {c.algorithm for c in every}
        missing = [a for a in _split(req.algorithms or "") if a not in ran]
        if missing:
            raise HiercollError(f"--algorithms: {', '.join(missing)} applies to none of "
                                f"{', '.join(kinds)} on this topology")
        return every
    from hiercoll.topology import load_topology
    sizes = req.sizes
    if req.plan:
        from hiercoll.plan_file import load_plan
        loaded = load_plan(req.plan)
        topo, base = loaded.topology, loaded.schedule.spec
        algos = [loaded.schedule.meta.algorithm]
        params = dict(loaded.schedule.meta.params)
        if req.algorithms:
            algos, params = _split(req.algorithms), {}
        if sizes is None and not req.algorithms:
            return [Case(algos[0], loaded.schedule, topo.name)]
    else:
        if not req.collective or not req.topology:
            raise HiercollError("give a plan file, or --collective and --topology")
        topo = load_topology(req.topology, req.nodes)
        base = CollectiveSpec(kind=Kind(req.collective), world_size=topo.world_size,
                              dtype=DType(req.dtype or "bf16"), nbytes=0,
                              reduce_op=ReduceOp(req.reduce_op or "sum"))
        algos = _split(req.algorithms) if req.algorithms else []
        params = {}
        if sizes is None:
            raise HiercollError("--sizes or --shapes: which sizes to run")
    overrides: dict[str, DType | ReduceOp] = {}   # typed: model_copy does not validate
    if req.dtype:
        overrides["dtype"] = DType(req.dtype)
    if req.reduce_op:
        overrides["reduce_op"] = ReduceOp(req.reduce_op)
    cases: list[Case] = []
    for nbytes in sizes or [base.nbytes]:
        spec = base.model_copy(update=overrides | {
            "nbytes": valid_nbytes(base.kind, base.world_size,
                                  base.model_copy(update=overrides).dtype, nbytes)})
        spec = CollectiveSpec.model_validate(spec.model_dump())
        names = algos or applicable(topo, spec) + ([LIBRARY] if spec.kind in LIBRARY_KINDS else [])
        if only_applicable and algos:
            fits = set(applicable(topo, spec)) | ({LIBRARY} if spec.kind in LIBRARY_KINDS else set())
            names = [a for a in algos if a in fits]
        for name in names:
            cases.append(Case(name, plan(topo, spec, name, params or None), topo.name))
    return cases


def _split(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]
