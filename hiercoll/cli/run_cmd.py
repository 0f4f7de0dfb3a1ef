"""`hiercoll run`: execute a plan on real ranks (torchrun, one process per GPU or CPU rank).

    torchrun --nproc-per-node 4 -m hiercoll run plan.json --backend cuda --check
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hiercoll.cli.backend_args import (add_backend_arg, add_cuda_args, backend_choice,
                                      device_type, enum_choices)
from hiercoll.cli.common import add_json_flag, print_json
from hiercoll.executor.interface import BackendName, Mode
from hiercoll.errors import HiercollError
from hiercoll.schedule import Schedule
from hiercoll.topology import Topology


@dataclass(frozen=True)
class Target:
    """A plan to run: a schedule and the topology it was planned for."""

    schedule: Schedule
    topology: Topology


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="plan file from `hiercoll plan ... -o plan.json`")
    add_backend_arg(p, BackendName.GLOO)
    p.add_argument("--expect-topology", default=None,
                   help="topology (preset or file) of this launch; refuse plans for another one")
    p.add_argument("--nodes", type=int, default=None, help="node count of --expect-topology")
    add_cuda_args(p)


def load_target(args: argparse.Namespace) -> Target:
    from hiercoll.plan_file import load_plan
    plan = load_plan(args.plan)
    return Target(plan.schedule, plan.topology)


def expected_fingerprint(args: argparse.Namespace) -> str | None:
    if args.expect_topology is None:
        return None
    from hiercoll.topology import load_topology
    return load_topology(args.expect_topology, args.nodes).fingerprint()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a plan on real ranks (under torchrun)",
                       description="Run a plan with the gloo (CPU), cuda or nccl backend; one "
                       "process per rank, e.g. `torchrun --nproc-per-node 4 -m hiercoll run "
                       "plan.json --backend cuda --check`.")
    add_plan_args(p)
    p.add_argument("--iters", type=int, default=1, help="calls to make")
    p.add_argument("--check", action="store_true",
                   help="compare every call with the numpy reference on fresh random inputs")
    p.add_argument("--mode", default="eager", choices=enum_choices(Mode))
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """`run` is the stress loop with the numpy reference; without --check nothing is compared."""
    if args.iters < 1:
        raise HiercollError(f"--iters: {args.iters} must be >= 1")
    target = load_target(args)
    choice = backend_choice(args)
    fingerprint = expected_fingerprint(args)
    from hiercoll.executor.graph_backend import maybe_graph
    from hiercoll.harness.inputs import RefKind
    from hiercoll.executor.interface import check_launch
    from hiercoll.harness.launch import init_from_env, shutdown
    from hiercoll.harness.prepare import prepare_for_mode
    from hiercoll.harness.stress import stress
    launch = init_from_env(device_type(args.backend))
    try:
        check_launch(target.schedule, launch.world_size, fingerprint)
        backend, prepared = prepare_for_mode(target.schedule, choice, args.mode, {})
        runner, prep = maybe_graph(backend, prepared, args.mode, launch.device)
        report = stress(runner, prep, launch.device, args.iters, RefKind.NUMPY, seed=0,
                        mode=args.mode, check=args.check)
    finally:
        shutdown()
    if launch.rank == 0:
        if args.json:
            print_json(report.to_json() | {"notes": prepared.notes})
        else:
            status = ("ok" if report.ok else "FAILED") if args.check else "ran"
            error = f", max abs error {report.max_abs_error:.3g}" if args.check else ""
            print(f"{status}: {report.iterations} call(s) of {report.algorithm} "
                  f"{report.collective} {report.nbytes} B on {report.world_size} ranks "
                  f"({prepared.backend.value}, {args.mode}){error}")
    return 0 if report.ok else 1
