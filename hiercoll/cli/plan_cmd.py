"""`hiercoll plan`: make a schedule and save it (expanded, or as a recipe)."""

from __future__ import annotations

import argparse

from rich.markup import escape

from hiercoll.cli.args import add_spec_args, make_spec, topology_from_args
from hiercoll.cli.common import (
    add_json_flag,
    add_topology_args,
    console,
    format_params,
    parse_kv,
    print_json,
)
from hiercoll.errors import OpLimitError
from hiercoll.plan_file import save_plan
from hiercoll.planner.registry import estimate_ops, get_algorithm, parse_params
from hiercoll.planner.search.select import plan_with
from hiercoll.schedule import Schedule
from hiercoll.units import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan one collective on a topology and save the schedule")
    add_topology_args(p)
    add_spec_args(p)
    p.add_argument("--algorithm", "-a", default="auto", help="ring, direct, two_shot, hier, ... or auto")
    p.add_argument("--param", "-p", action="append", help="algorithm parameter key=value (repeatable)")
    p.add_argument("--tuning", default=None,
                   help="tuning.json from `hiercoll autopick` (for auto; must be an existing file)")
    p.add_argument("--form", choices=["expanded", "recipe"], default="expanded",
                   help="save every op, or only the recipe (re-planned on load)")
    p.add_argument("-o", "--output", required=True, help="plan file to write")
    add_json_flag(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    spec = make_spec(args, topology)
    chosen = plan_with(topology, spec, args.algorithm, parse_kv(args.param), args.tuning)
    schedule = chosen.schedule
    saved = schedule if args.form == "recipe" else schedule.expand()
    num_ops, estimated = op_count(saved), False
    if num_ops is None and not saved.is_library_call:      # too many ranks to walk: estimate
        algo = get_algorithm(schedule.meta.algorithm)
        num_ops = estimate_ops(topology, spec, algo, parse_params(algo, schedule.meta.params))
        estimated = True
    save_plan(args.output, saved, topology, args.form)
    info = {"output": args.output, "algorithm": schedule.meta.algorithm,
            "params": schedule.meta.params, "num_ops": num_ops, "num_ops_estimated": estimated,
            "topology": topology.name, "fingerprint": topology.fingerprint(),
            "how": chosen.how}
    if args.json:
        print_json(info)
    else:
        params = format_params(schedule.meta.params)
        console.print(escape(f"wrote {args.output}: {schedule.meta.algorithm}"
                             f"{' ' + params if params else ''} "
                             f"({'uncounted' if num_ops is None else num_ops}"
                             f"{' ops, estimated' if estimated else ' ops'}) for "
                             f"{spec.kind.value} of {format_size(spec.total_bytes)} on "
                             f"{topology.name} [{chosen.how}]"))
    return 0


COUNT_RANKS = 256     # a recipe is counted exactly when that builds at most this many ranks


def op_count(schedule: Schedule) -> int | None:
    """The plan's op count, building as few ranks as it can: an expanded plan has them; a lazy
    one whose algorithm declares a symmetry (rank r+P, or r xor P, runs rank r's program) has
    W/P copies of its first P ranks' ops, so a 128-rank recipe builds 8 ranks, not 128 (its
    LRU cache holds 64: counting all would build every rank, and again on the next count).
    None: a recipe too large to walk (HIERCOLL_MAX_OPS), or one whose count would build more
    than COUNT_RANKS ranks (a 4096-GPU hier on an ECMP fabric, period 2048, took 455 s,
    printing nothing, only to count): the caller estimates instead."""
    period, world = schedule.meta.symmetry_period, schedule.world_size
    to_build = period if period and world % period == 0 else world
    if not schedule.is_expanded and to_build > COUNT_RANKS:
        return None
    if schedule.is_expanded or not period or world % period:
        try:
            return schedule.num_ops
        except OpLimitError:
            return None
    return world // period * sum(len(schedule.rank_ops(r)) for r in range(period))
