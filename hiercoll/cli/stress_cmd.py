"""`hiercoll stress`: run plans many times on fresh random inputs against an independent reference.

    torchrun --nproc-per-node 4 -m hiercoll stress plan.json --backend cuda --iters 2000
    torchrun --nproc-per-node 4 -m hiercoll stress --collective all_reduce --topology h200x4 \
        --algorithms ring,direct --shapes 1,7,128,1024 --hidden 2880,4096 --modes eager,graph

Fails (exit 1) if any iteration's error exceeds the dtype's bound; reports the worst error and the
first bad iteration per case. `--out` writes every case as JSON (what bench/gpu commits).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from hiercoll.cli import fused_norm_cmd
from hiercoll.cli.backend_args import (
    add_backend_arg,
    add_cuda_args,
    add_sweep_args,
    backend_choice,
    device_type,
    need_one_gpu,
    sweep_request,
)
from hiercoll.cli.common import add_json_flag, print_json, print_table
from hiercoll.errors import HiercollError
from hiercoll.executor.interface import BackendName
from hiercoll.files import write_atomic
from hiercoll.units import parse_size, parse_size_range

if TYPE_CHECKING:
    from hiercoll.collectives import CollectiveSpec
    from hiercoll.harness.inputs import RefKind
    from hiercoll.harness.launch import Launch
    from hiercoll.harness.prepare import BackendChoice, PrepareCache
    from hiercoll.harness.sweep import Case

# auto: the numpy reference up to here; above, the device reference where it covers the
# collective (harness/device_reference.py: every rank draws every rank's input on its GPU), else
# numpy. The numpy reference draws and sums every rank's input on the host each iteration:
# ~50 ms at 4 MiB on 4 ranks, minutes for one 2000-iteration TP-shape case.
AUTO_NUMPY_LIMIT = 256 << 10


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stress", help="stress-test plans on real ranks against a reference")
    add_sweep_args(p)
    add_backend_arg(p, BackendName.GLOO)
    p.add_argument("--sizes", default=None, help="byte sizes, LOW:HIGH or a,b,c")
    p.add_argument("--shapes", default=None, help="M values: sizes are M x hidden elements")
    p.add_argument("--hidden", default="2880,4096", help="hidden sizes for --shapes")
    p.add_argument("--iters", type=int, default=100,
                   help="calls per case, each on fresh random inputs")
    p.add_argument("--modes", default="eager", help="eager, graph or eager,graph")
    p.add_argument("--reference", default="auto", choices=["auto", "numpy", "device", "library"],
                   help=f"auto: numpy up to {AUTO_NUMPY_LIMIT >> 10} KiB, above it the device "
                   "reference (every rank draws every rank's input on its device, float64 "
                   "there) where it covers the collective, else numpy; library: NCCL's call")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--one-gpu", action="store_true",
                   help="cuda: run every rank in this one process on its one GPU (no torchrun): "
                   "checks kernels, signals and graph replay; says nothing about NVLink speed")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="--one-gpu: stop a case after this long (the report says how many "
                   "iterations ran)")
    p.add_argument("--out", default=None, help="write all reports to this JSON file (rank 0)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="bound every wait on a peer (gloo: a stopped or dead rank ends the job "
                   "with one line naming the op and the peer; default 300)")
    add_cuda_args(p)
    add_json_flag(p)
    fused_norm_cmd.add_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hiercoll.harness.sweep import cases_for
    if args.iters < 1:
        raise HiercollError(f"--iters: {args.iters} must be >= 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("eager", "graph"):
            raise HiercollError(f"--modes: {m!r} should be eager or graph")
    if args.fused_rmsnorm:
        fused = fused_norm_cmd.run_fused(args, modes)
        return 0 if fused is None else _summarise(args, fused)
    sizes = _sizes(args)
    cases: list[Case] = cases_for(sweep_request(args, sizes))
    choice = backend_choice(args)
    if args.one_gpu:
        if choice.name != BackendName.CUDA:
            raise HiercollError("--one-gpu: needs --backend cuda")
        if args.reference == "library":
            raise HiercollError("--reference library: the library needs one process per GPU; "
                                "with --one-gpu use auto, device or numpy")
        from hiercoll.harness.launch import set_safe_cuda_env
        set_safe_cuda_env()     # and enough CUDA queues for every rank's streams
        need_one_gpu()
        if all(c.schedule.is_library_call for c in cases):
            raise HiercollError("--one-gpu: a library (nccl) plan needs one process per GPU; "
                                "run it under torchrun")
        reports = []
        for case in cases:     # the file is rewritten after every case: a killed sweep keeps it
            reports += _one_gpu_case(case, modes, choice, args)
            if args.out:
                _write_reports(args, reports)
        return _summarise(args, reports)
    from hiercoll.harness.launch import init_from_env, peer_failures, shutdown
    launch = init_from_env(device_type(args.backend), args.timeout, nvshmem=choice.nvshmem)
    reports = []
    try:
        with peer_failures(launch.rank):
            for case in cases:
                for r in _stress_case(case, modes, launch, choice, args):
                    reports.append(r)
                    if launch.rank == 0 and not args.json:
                        _print_case(r)
    finally:
        shutdown()
    return _summarise(args, reports) if launch.rank == 0 else (
        0 if all(r["ok"] for r in reports) else 1)


def _print_case(r: dict[str, Any]) -> None:
    print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['algorithm']:>10} {r['collective']} "
          f"{r['nbytes']:>11} B {r['mode']:5} iters {r['iterations']:5} "
          f"max|err| {r['max_abs_error']:.3g} (bound {r['bound']:.3g})"
          + ("" if r["ok"] else f" first bad iteration {r['first_bad_iteration']}")
          + _identical_words(r.get("ranks_identical")), flush=True)


def _identical_words(identical: bool | None) -> str:
    """`ranks_identical` of a case in words (nothing where it does not apply)."""
    return "" if identical is None else (" ranks_identical=true" if identical else
                                         " ranks_identical=FALSE (ranks got different bits)")


def _summarise(args: argparse.Namespace, reports: list[dict[str, Any]]) -> int:
    """Rank 0 (or the one process): the JSON file, and the summary table or JSON."""
    ok = all(r["ok"] for r in reports)
    if args.out:
        _write_reports(args, reports)
    if args.json:
        print_json({"ok": ok, "cases": reports})
    else:
        bad = [r for r in reports if not r["ok"]]
        print_table("stress summary", ["field", "value"],
                    [["cases", len(reports)], ["failed", len(bad)],
                     ["ranks not identical",
                      sum(r.get("ranks_identical") is False for r in reports)],
                     ["worst error", max((r["max_abs_error"] for r in reports), default=0)]])
    return 0 if ok else 1


def _write_reports(args: argparse.Namespace, reports: list[dict[str, Any]]) -> None:
    write_atomic(args.out, json.dumps({"backend": args.backend, "cases": reports}, indent=1,
                                      sort_keys=True) + "\n")


def _sizes(args: argparse.Namespace) -> list[int] | None:
    if args.sizes and args.shapes:
        raise HiercollError("--sizes and --shapes: give one of them")
    if args.sizes:
        return parse_size_range(args.sizes)
    if args.shapes:
        from hiercoll.collectives import DType
        item = DType(args.dtype or "bf16").itemsize
        hidden = [parse_size(h, "--hidden") for h in args.hidden.split(",")]
        ms = [parse_size(m, "--shapes") for m in args.shapes.split(",")]
        return sorted({m * h * item for h in hidden for m in ms})
    return None


def _auto_reference(spec: CollectiveSpec, device_type: str) -> RefKind:
    """numpy up to AUTO_NUMPY_LIMIT (and on CPU), the device reference above where it covers
    the collective; group_cast / group_reduce always take numpy."""
    from hiercoll.harness.device_reference import COVERED
    from hiercoll.harness.inputs import RefKind
    if (spec.total_bytes <= AUTO_NUMPY_LIMIT or device_type == "cpu"
            or spec.kind not in COVERED):
        return RefKind.NUMPY
    return RefKind.DEVICE


def _stress_case(case: Case, modes: list[str], launch: Launch, choice: BackendChoice,
                 args: argparse.Namespace) -> list[dict[str, Any]]:
    """One prepare per case and lowering (graph mode takes the single-stream one), every mode."""
    from hiercoll.executor.backends import get_backend
    from hiercoll.executor.graph_backend import maybe_graph
    from hiercoll.executor.interface import check_launch
    from hiercoll.harness.inputs import RefKind
    from hiercoll.harness.prepare import prepare_for_mode
    from hiercoll.harness.stress import stress
    check_launch(case.schedule, launch.world_size)
    cache: PrepareCache = {}
    ref = RefKind(args.reference) if args.reference != "auto" else _auto_reference(
        case.schedule.spec, launch.device.type)
    ref_backend = ref_prep = None
    if ref == RefKind.LIBRARY:
        ref_backend = get_backend(BackendName.NCCL)
        ref_prep = ref_backend.prepare(case.schedule)
    out = []
    for mode in modes:
        backend, prepared = prepare_for_mode(case.schedule, choice, mode, cache)
        runner, prep = maybe_graph(backend, prepared, mode, launch.device)
        report = stress(runner, prep, launch.device, args.iters, ref, seed=args.seed, mode=mode,
                        ref_backend=ref_backend, ref_prepared=ref_prep)
        out.append(report.to_json() | {"topology": case.topology_name, "notes": prepared.notes})
    return out


def _one_gpu_case(case: Case, modes: list[str], choice: BackendChoice,
                  args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every rank of the case in this process on one GPU (the library row needs real ranks)."""
    from hiercoll.executor.cuda.lowering import CudaOptions
    from hiercoll.executor.cuda.one_gpu import OneGpuCluster
    from hiercoll.harness.one_gpu_stress import stress_one_gpu
    if case.schedule.is_library_call:
        return []
    out = []
    clusters: dict[CudaOptions, OneGpuCluster] = {}    # modes with one lowering share a cluster
    for mode in modes:
        opts = CudaOptions(**choice.options(mode))
        if opts not in clusters:
            clusters[opts] = OneGpuCluster(case.schedule, opts)
        cluster = clusters[opts]
        report = stress_one_gpu(cluster, args.iters, mode, seed=args.seed,
                                max_seconds=args.max_seconds,
                                numpy_reference=args.reference == "numpy")
        r = report.to_json() | {"topology": case.topology_name,
                                "notes": cluster.prepared[0].notes}
        if not args.json:
            _print_case(r)
        out.append(r)
    return out
