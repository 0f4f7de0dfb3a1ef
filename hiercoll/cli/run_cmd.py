"""`hiercoll run`: execute a plan on real ranks (torchrun, one process per GPU or CPU rank).

    torchrun --nproc-per-node 4 -m hiercoll run plan.json --backend cuda --check
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from hiercoll.cli.common import add_json_flag, print_json
from hiercoll.errors import HiercollError
from hiercoll.schedule import Schedule
from hiercoll.topology import Topology

BACKENDS = ["gloo", "cuda", "nccl"]


@dataclass(frozen=True)
class Target:
    """A plan to run: a schedule and the topology it was planned for."""

    schedule: Schedule
    topology: Topology


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="plan file from `hiercoll plan ... -o plan.json`")
    p.add_argument("--backend", default="gloo", choices=BACKENDS)
    p.add_argument("--expect-topology", default=None,
                   help="topology (preset or file) of this launch; refuse plans for another one")
    p.add_argument("--nodes", type=int, default=None, help="node count of --expect-topology")
    add_cuda_args(p)


def add_cuda_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ce-threshold", default="8MiB",
                   help="cuda: copies of at least this many bytes use the copy engine")
    p.add_argument("--ctas", type=int, default=None, help="cuda: CTAs per kernel (default auto)")
    p.add_argument("--debug-timeout-ms", type=float, default=0.0,
                   help="cuda: abort a signal wait after this long and report rank/op/peer")
    p.add_argument("--inter-transport", default="peer", choices=["peer", "nccl"],
                   help="cuda: inter-node ops through peer mappings (one NVLink domain) or "
                   "NCCL send/recv between the owners")
    p.add_argument("--no-fuse", action="store_true",
                   help="cuda: keep barriers as their own launches (single-stream programs "
                   "without copy-engine ops are otherwise one kernel per call)")
    p.add_argument("--single-stream", action="store_true",
                   help="cuda: one stream per rank in a global dependency order (no kernel can "
                   "wait on a sibling branch of its own CUDA graph)")


def cuda_options(args: argparse.Namespace) -> dict[str, Any]:
    from hiercoll.units import parse_size
    opts: dict[str, Any] = {"ce_threshold_bytes": parse_size(args.ce_threshold, "--ce-threshold"),
                            "debug_timeout_ms": args.debug_timeout_ms,
                            "inter_transport": args.inter_transport,
                            "single_stream": args.single_stream, "fuse": not args.no_fuse}
    if args.ctas is not None:
        opts["ctas"] = args.ctas
    return opts


def backend_options(args: argparse.Namespace, mode: str = "eager") -> dict[str, Any]:
    """Validated before any process group starts, so a typo costs no launch.

    Graph mode takes the single-stream lowering: capture turns a rank's streams into branches of
    one graph, and CUDA may run independent branches one after another, so a kernel spinning on a
    sibling branch never returns (seen on an H200: one-GPU runs of all-reduce plans timed out on
    their first replay with channel streams, and passed with one stream)."""
    if args.backend != "cuda":
        return {}
    from hiercoll.executor.cuda.lowering import CudaOptions
    opts = cuda_options(args)
    if mode == "graph":
        opts["single_stream"] = True
    CudaOptions(**opts)
    return opts


def prepare_for_mode(schedule: Any, args: argparse.Namespace, mode: str,
                     cache: dict[Any, tuple[Any, Any]]) -> tuple[Any, Any]:
    """(backend, prepared) for one mode of one case. A library plan runs on the `nccl` backend
    whatever --backend says; modes whose backend options are the same share one prepare (one set
    of symmetric allocations) through the caller's `cache`."""
    from hiercoll.executor.backends import get_backend
    name = "nccl" if schedule.is_library_call else args.backend
    opts = {} if name == "nccl" else backend_options(args, mode)
    key = (name, tuple(sorted(opts.items())))
    if key not in cache:
        backend = get_backend(name, **opts)
        cache[key] = (backend, backend.prepare(schedule))
    return cache[key]


def load_target(args: argparse.Namespace) -> Target:
    from hiercoll.plan_file import load_plan
    plan = load_plan(args.plan)
    return Target(plan.schedule, plan.topology)


def expected_fingerprint(args: argparse.Namespace) -> str | None:
    if args.expect_topology is None:
        return None
    from hiercoll.topology import load_topology
    return load_topology(args.expect_topology, args.nodes).fingerprint()


def device_type(backend: str) -> str:
    return "cpu" if backend == "gloo" else "cuda"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run a plan on real ranks (under torchrun)",
                       description="Run a plan with the gloo (CPU), cuda or nccl backend; one "
                       "process per rank, e.g. `torchrun --nproc-per-node 4 -m hiercoll run "
                       "plan.json --backend cuda --check`.")
    add_plan_args(p)
    p.add_argument("--iters", type=int, default=1, help="calls to make")
    p.add_argument("--check", action="store_true",
                   help="compare every call with the numpy reference on fresh random inputs")
    p.add_argument("--mode", default="eager", choices=["eager", "graph"])
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """`run` is the stress loop with the numpy reference; without --check nothing is compared."""
    if args.iters < 1:
        raise HiercollError(f"--iters: {args.iters} must be >= 1")
    target = load_target(args)
    backend_options(args)
    fingerprint = expected_fingerprint(args)
    from hiercoll.executor.graph_backend import maybe_graph
    from hiercoll.harness.inputs import RefKind
    from hiercoll.executor.interface import check_launch
    from hiercoll.harness.launch import init_from_env, shutdown
    from hiercoll.harness.stress import stress
    launch = init_from_env(device_type(args.backend))
    try:
        check_launch(target.schedule, launch.world_size, fingerprint)
        backend, prepared = prepare_for_mode(target.schedule, args, args.mode, {})
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
