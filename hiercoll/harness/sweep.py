"""Which schedules a stress or bench sweep runs: from a plan file, or planned per size from
(--collective, --topology, --algorithms). No torch; shared by the stress and bench commands."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hiercoll.collectives import CollectiveSpec, Kind, valid_nbytes
from hiercoll.errors import HiercollError
from hiercoll.planner.search.library import LIBRARY, LIBRARY_KINDS
from hiercoll.schedule import Schedule


@dataclass(frozen=True)
class Case:
    algorithm: str
    schedule: Schedule
    topology_name: str


def cases_from_args(args: argparse.Namespace, sizes: list[int] | None) -> list[Case]:
    """One case per (algorithm, size), every rank building the same list."""
    from hiercoll.planner import applicable, plan
    from hiercoll.topology import load_topology
    if args.plan:
        from hiercoll.plan_file import load_plan
        loaded = load_plan(args.plan)
        topo, base = loaded.topology, loaded.schedule.spec
        algos = [loaded.schedule.meta.algorithm]
        params = dict(loaded.schedule.meta.params)
        if args.algorithms:
            algos, params = _split(args.algorithms), {}
        if sizes is None and not args.algorithms:
            return [Case(algos[0], loaded.schedule, topo.name)]
    else:
        if not args.collective or not args.topology:
            raise HiercollError("give a plan file, or --collective and --topology")
        topo = load_topology(args.topology, args.nodes)
        base = CollectiveSpec(kind=Kind(args.collective), world_size=topo.world_size,
                              dtype=args.dtype or "bf16", nbytes=0,
                              reduce_op=args.reduce_op or "sum")
        algos = _split(args.algorithms) if args.algorithms else []
        params = {}
        if sizes is None:
            raise HiercollError("--sizes or --shapes: which sizes to run")
    overrides = {}
    if args.dtype:
        overrides["dtype"] = args.dtype
    if args.reduce_op:
        overrides["reduce_op"] = args.reduce_op
    cases: list[Case] = []
    for nbytes in sizes or [base.nbytes]:
        spec = base.model_copy(update=overrides | {
            "nbytes": valid_nbytes(base.kind, base.world_size,
                                  base.model_copy(update=overrides).dtype, nbytes)})
        spec = CollectiveSpec.model_validate(spec.model_dump())
        names = algos or applicable(topo, spec) + ([LIBRARY] if spec.kind in LIBRARY_KINDS else [])
        for name in names:
            cases.append(Case(name, plan(topo, spec, name, params or None), topo.name))
    return cases


def _split(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]
