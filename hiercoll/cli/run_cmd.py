"""`hiercoll run`: execute a plan on real ranks (torchrun, one process per GPU or CPU rank).

    torchrun --nproc-per-node 4 -m hiercoll run plan.json --backend cuda --check
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hiercoll.cli.backend_args import (
    add_backend_arg,
    add_cuda_args,
    backend_choice,
    device_type,
    enum_choices,
)
from hiercoll.cli.common import add_json_flag, print_json
from hiercoll.errors import HiercollError
from hiercoll.executor.interface import BackendName, Mode
from hiercoll.schedule import Schedule
from hiercoll.topology import Topology

if TYPE_CHECKING:
    from hiercoll.harness.prepare import BackendChoice


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
    p.add_argument("--mode", default="eager", choices=enum_choices(Mode),
                   help="eager calls, or one CUDA graph replayed (cuda)")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="cuda: after the calls, time one more call launch by launch (one op "
                   "per launch) and write its per-op timeline here (rank 0), for `hiercoll "
                   "compare --timeline`")
    p.add_argument("--one-gpu", action="store_true",
                   help="cuda: every rank in this one process on its one GPU (no torchrun)")
    p.add_argument("--tuning", default=None, metavar="FILE",
                   help="cuda: tuning.json from `hiercoll autopick -o`: its executor knobs for "
                   "this plan's size (the copy-engine threshold) unless given as flags")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="bound every wait on a peer (gloo: a stopped or dead rank ends the job "
                   "with one line naming the op and the peer; default 300)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """`run` is the stress loop with the numpy reference; without --check nothing is compared."""
    if args.iters < 1:
        raise HiercollError(f"--iters: {args.iters} must be >= 1")
    target = load_target(args)
    choice = backend_choice(args)
    if args.tuning is not None:
        from hiercoll.planner.search.autopick import tuned_executor
        choice = choice.with_tuning(tuned_executor(args.tuning, target.topology,
                                                   target.schedule.spec))
    fingerprint = expected_fingerprint(args)
    if (args.profile or args.one_gpu) and choice.name != BackendName.CUDA:
        raise HiercollError("--profile/--one-gpu: need --backend cuda (the timeline is CUDA "
                            "events around our own launches)")
    if args.one_gpu:
        return _run_one_gpu(target, choice, args)
    from hiercoll.executor.graph_backend import maybe_graph
    from hiercoll.executor.interface import check_launch
    from hiercoll.harness.inputs import RefKind
    from hiercoll.harness.launch import init_from_env, peer_failures, shutdown
    from hiercoll.harness.prepare import prepare_for_mode
    from hiercoll.harness.stress import stress
    launch = init_from_env(device_type(args.backend), args.timeout, nvshmem=choice.nvshmem)
    try:
        with peer_failures(launch.rank):
            check_launch(target.schedule, launch.world_size, fingerprint)
            backend, prepared = prepare_for_mode(target.schedule, choice, args.mode, {})
            runner, prep = maybe_graph(backend, prepared, args.mode, launch.device)
            report = stress(runner, prep, launch.device, args.iters, RefKind.NUMPY, seed=0,
                            mode=args.mode, check=args.check)
            if args.profile:
                _profile_ranks(target, choice, launch.rank, launch.device, args.profile)
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
                  f"({prepared.ran_on}, {args.mode}){error}"
                  + _identical_words(report.ranks_identical) + _time_words(report, target))
    return 0 if report.ok else 1


def _time_words(report: Any, target: Target) -> str:
    """p50 per call and nccl-tests' algbw/busbw (a call alone, host-timed: `hiercoll bench`
    times back-to-back calls and graphs)."""
    if report.p50_us is None:
        return ""
    algbw, busbw = target.schedule.spec.bandwidths_gbps(report.p50_us)
    return (f"\n  p50 {report.p50_us:.1f} us per call, algbw {algbw:.2f} GB/s, busbw "
            f"{busbw:.2f} GB/s (one call at a time, host-timed; hiercoll bench for "
            "back-to-back and graph timings)")


def _identical_words(identical: bool | None) -> str:
    """--check where ranks share outputs: did every rank get the same bits (None: not asked)."""
    return "" if identical is None else ("; ranks identical" if identical else
                                         "; RANKS DIFFER (different bits on different ranks)")


def _profile_ranks(target: Target, choice: BackendChoice, rank: int, device: Any,
                   path: str) -> None:
    """One more call, lowered one op per launch, timed by every rank; rank 0 writes it."""
    import json

    import torch.distributed as dist

    from hiercoll.executor.cuda.backend import CudaBackend
    from hiercoll.executor.cuda.lowering import CudaOptions
    from hiercoll.files import write_atomic
    from hiercoll.harness.profile import profile_rank, profiling_options, timeline_document
    options = profiling_options(CudaOptions(**choice.options(Mode.EAGER)))
    backend = CudaBackend(**dataclasses.asdict(options))
    prepared = backend.prepare(target.schedule)
    rows = profile_rank(backend, prepared, device)
    gathered: list[Any] = [None] * dist.get_world_size() if rank == 0 else []
    dist.gather_object(rows, gathered if rank == 0 else None, dst=0)
    if rank == 0:
        doc = timeline_document(target.schedule, target.topology.name,
                                [row for part in gathered for row in part],
                                f"{dist.get_world_size()} processes, one GPU each")
        write_atomic(path, json.dumps(doc, indent=1) + "\n")


def _run_one_gpu(target: Target, choice: BackendChoice, args: argparse.Namespace) -> int:
    """Every rank in this process (checks as `stress --one-gpu` does); then the profile."""
    import json

    from hiercoll.cli.backend_args import need_one_gpu
    from hiercoll.executor.cuda.lowering import CudaOptions
    from hiercoll.executor.cuda.one_gpu import OneGpuCluster
    from hiercoll.files import write_atomic
    from hiercoll.harness.launch import set_safe_cuda_env
    from hiercoll.harness.one_gpu_stress import stress_one_gpu
    from hiercoll.harness.profile import profile_one_gpu
    set_safe_cuda_env()
    need_one_gpu()
    target.schedule.refuse_library_call("--one-gpu")
    options = CudaOptions(**choice.options(args.mode))
    cluster = OneGpuCluster(target.schedule.expand(), options)
    report = stress_one_gpu(cluster, args.iters, args.mode, numpy_reference=True) \
        if args.check else None
    if args.profile:
        doc = profile_one_gpu(target.schedule, options, target.topology.name)
        write_atomic(args.profile, json.dumps(doc, indent=1) + "\n")
    ok = report is None or report.ok
    identical = None if report is None else report.ranks_identical
    if args.json:
        print_json({"ok": ok, "report": None if report is None else report.to_json(),
                    "profile": args.profile, "ranks_identical": identical})
    else:
        print(f"{'ok' if ok else 'FAILED'}: {target.schedule.meta.algorithm} "
              f"{target.schedule.spec.kind.value} on {target.schedule.world_size} ranks, one GPU"
              + ("" if report is None else f", {report.iterations} checked call(s)")
              + _identical_words(identical)
              + (f"; timeline in {args.profile}" if args.profile else ""))
    return 0 if ok else 1
