"""`hiercoll bench`: time algorithms (and the NCCL library call) per size, eager and graph mode.

    torchrun --nproc-per-node 4 -m hiercoll bench --collective all_reduce --topology h200x4 \
        --sizes 8KiB:1GiB --algorithms ring,direct,two_shot,nccl --modes eager,graph --out DIR
    hiercoll bench --one-gpu --collective all_reduce --topology one-gpu-h200 --sizes 8KiB:256MiB

Graph mode times a graph of --graph-calls back-to-back calls (nccl-tests' -G), per call. With
--peers (default on GPUs: nccl and torch's symmetric-memory kernels) every size also gets the
rows of what users run instead, timed the same way in the same run (harness/peers.py).

Writes DIR/<collective>-w<W>.json (long-form rows with each plan's recipe + command, versions,
date, machine), DIR/<collective>-w<W>.md (a table) and DIR/<collective>-w<W>.png (busbw versus
size). The JSON is what `hiercoll calibrate` and `hiercoll compare` read.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from hiercoll.cli.backend_args import (
    add_backend_arg,
    add_cuda_args,
    add_sweep_args,
    backend_choice,
    device_type,
    sweep_request,
)
from hiercoll.cli.common import add_json_flag, print_json, print_table
from hiercoll.errors import HiercollError
from hiercoll.executor.interface import BackendName, Mode
from hiercoll.harness.defaults import EAGER_CALLS, GRAPH_CALLS, PEERS
from hiercoll.harness.results import row_label
from hiercoll.units import format_size, parse_size_range

if TYPE_CHECKING:
    from hiercoll.harness.launch import Launch
    from hiercoll.harness.prepare import BackendChoice, PrepareCache
    from hiercoll.harness.sweep import Case


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark algorithms against the NCCL library call")
    add_sweep_args(p)
    add_backend_arg(p, BackendName.CUDA)
    p.add_argument("--sizes", default="8KiB:1GiB", help="LOW:HIGH[:FACTOR] or a,b,c")
    p.add_argument("--modes", default="eager,graph",
                   help="eager (batches of --eager-calls back-to-back calls), graph (CUDA graph of "
                   "--graph-calls calls), or both")
    p.add_argument("--iters", type=int, default=None,
                   help="timed samples per point: graph replays or eager batches (default by size)")
    p.add_argument("--out", default=None, help="directory for JSON/MD/PNG results (rank 0)")
    p.add_argument("--zero-copy", action="store_true",
                   help="cuda: run on the symmetric buffers (time the collective without the "
                   "copy-in/copy-out of user tensors)")
    p.add_argument("--graph-calls", type=int, default=GRAPH_CALLS,
                   help="graph mode: calls captured in one graph, timed per call (as "
                   "nccl-tests' CUDA-graph mode)")
    p.add_argument("--eager-calls", type=int, default=EAGER_CALLS,
                   help="eager mode: back-to-back calls between two CUDA events, timed per call "
                   "(1 times each call alone, with the events' host cost inside it)")
    p.add_argument("--peers", default="all",
                   help="rows of what users run instead, same harness and run: comma list of "
                   f"{', '.join(PEERS)}; 'all' (default) or 'none'")
    p.add_argument("--one-gpu", action="store_true",
                   help="cuda: every rank in this one process on its one GPU (no torchrun); "
                   "times what the one-gpu-* topologies predict, not NVLink")
    add_cuda_args(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hiercoll.harness.sweep import cases_for
    sizes = parse_size_range(args.sizes)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in ("eager", "graph") for m in modes):
        raise HiercollError(f"--modes: {args.modes!r} should list eager and/or graph")
    peers = _peer_names(args.peers)      # a misspelt peer is refused before anything starts
    if args.graph_calls < 1:
        raise HiercollError(f"--graph-calls: {args.graph_calls}; give at least 1")
    if args.eager_calls < 1:
        raise HiercollError(f"--eager-calls: {args.eager_calls}; give at least 1")
    cases = cases_for(sweep_request(args, sizes))
    choice = backend_choice(args)
    if args.one_gpu:
        return _run_one_gpu(cases, modes, choice, args)
    from hiercoll.harness.launch import init_from_env, peer_failures, shutdown
    launch = init_from_env(device_type(args.backend), nvshmem=choice.nvshmem)
    if launch.device.type != "cuda" and "graph" in modes:
        modes = [m for m in modes if m != "graph"]
    rows: list[dict[str, Any]] = []
    if launch.device.type != "cuda":       # the peers are CUDA calls
        peers = ()
    points_done: set[tuple[str, int]] = set()     # (collective, size): peers once per point
    try:
        with peer_failures(launch.rank):
            for case in cases:
                found = _bench_case(case, modes, launch, choice, args)
                spec = case.schedule.spec
                point = (spec.kind.value, spec.total_bytes)
                if peers and point not in points_done:
                    points_done.add(point)
                    found += _bench_peers(case, peers, modes, launch, args)
                for row in found:
                    rows.append(row)
                    if launch.rank == 0 and not args.json:
                        _print_row(row)
    finally:
        shutdown()
    if launch.rank == 0:
        _report(rows, cases, launch.world_size, args)
    return 0


def _print_row(row: dict[str, Any]) -> None:
    print(f"{row_label(row):>10} {row['mode']:5} {format_size(row['nbytes']):>8} "
          f"p50 {row['p50_us']:9.1f} us  busbw {row['busbw_gbps']:7.1f} GB/s", flush=True)


def _report(rows: list[dict[str, Any]], cases: list[Case], world_size: int,
            args: argparse.Namespace) -> None:
    if args.out and rows:
        from hiercoll.harness.results import write_results
        write_results(args.out, rows, world_size)
    if args.json:
        print_json({"rows": rows})
    else:
        cols = ["algorithm", "mode", "bytes", "p50 us", "p90 us", "p99 us", "busbw GB/s"]
        kinds = ", ".join(dict.fromkeys(c.schedule.spec.kind.value for c in cases))
        print_table(f"{kinds} on {world_size} ranks", cols,
                    [[row_label(r), r["mode"], format_size(r["nbytes"]), f"{r['p50_us']:.2f}",
                      f"{r['p90_us']:.2f}", f"{r['p99_us']:.2f}", f"{r['busbw_gbps']:.2f}"]
                     for r in rows])


def _bench_case(case: Case, modes: list[str], launch: Launch, choice: BackendChoice,
                args: argparse.Namespace) -> list[dict[str, Any]]:
    """One prepare (one set of symmetric allocations) per case and lowering: graph mode takes
    the single-stream lowering (`BackendChoice.options`)."""
    from hiercoll.executor.interface import check_launch
    from hiercoll.harness.bench import iterations_for, make_row, time_run
    from hiercoll.harness.prepare import prepare_for_mode
    check_launch(case.schedule, launch.world_size)
    iters = args.iters or iterations_for(case.schedule.spec.total_bytes)
    rows: list[dict[str, Any]] = []
    cache: PrepareCache = {}
    for mode in modes:
        backend, prepared = prepare_for_mode(case.schedule, choice, mode, cache)
        zero_copy = args.zero_copy and prepared.backend == BackendName.CUDA
        timing = time_run(backend, prepared, launch.device, Mode(mode), iters, zero_copy=zero_copy,
                          graph_calls=args.graph_calls, eager_calls=args.eager_calls)
        options = choice.options(mode) if prepared.backend == BackendName.CUDA else {}
        rows.append(make_row(case.schedule, prepared.ran_on, Mode(mode),
                             case.topology_name, timing, zero_copy=zero_copy,
                             options=options).to_json())
    return rows


def _peer_names(text: str) -> tuple[str, ...]:
    if text == "all":
        return PEERS
    if text == "none":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise HiercollError(f"--peers: {bad[0]!r} is not a peer; one of {', '.join(PEERS)}, "
                            "'all' or 'none'")
    return names


def _bench_peers(case: Case, names: tuple[str, ...], modes: list[str], launch: Launch,
                 args: argparse.Namespace) -> list[dict[str, Any]]:
    """The peers' rows at this case's size (once per size), every rank alike."""
    from hiercoll.executor.torch_dtypes import torch_dtype
    from hiercoll.harness.bench import iterations_for, peer_row, time_call
    from hiercoll.harness.peers import peers_for
    spec = case.schedule.spec
    iters = args.iters or iterations_for(spec.total_bytes)
    rows = []
    for peer in peers_for(spec, names, launch.device, torch_dtype(spec.dtype)):
        for mode in modes:
            timing = time_call(peer.call, launch.device, Mode(mode), iters,
                               graph_calls=args.graph_calls, eager_calls=args.eager_calls)
            rows.append(peer_row(spec, peer.name, Mode(mode), case.topology_name,
                                 timing).to_json())
    return rows


def _run_one_gpu(cases: list[Case], modes: list[str], choice: BackendChoice,
                 args: argparse.Namespace) -> int:
    """Every rank of each case in this process; library plans need real ranks and are skipped
    (said once)."""
    from hiercoll.cli.backend_args import need_one_gpu
    from hiercoll.executor.cuda.lowering import CudaOptions
    from hiercoll.executor.cuda.one_gpu import OneGpuCluster
    from hiercoll.harness.bench import iterations_for, make_row
    from hiercoll.harness.launch import set_safe_cuda_env
    from hiercoll.harness.one_gpu_bench import time_one_gpu
    if choice.name != BackendName.CUDA:
        raise HiercollError("--one-gpu: needs --backend cuda")
    if args.zero_copy:
        raise HiercollError("--one-gpu: times the whole call; drop --zero-copy")
    set_safe_cuda_env()
    need_one_gpu()
    runnable = [c for c in cases if not c.schedule.is_library_call]
    if not runnable:
        raise HiercollError("--one-gpu: a library (nccl) plan needs one process per GPU; run it "
                            "under torchrun")
    if len(runnable) < len(cases) and not args.json:
        print("note: library (nccl) rows skipped: they need one process per GPU", flush=True)
    rows: list[dict[str, Any]] = []
    for case in runnable:
        iters = args.iters or iterations_for(case.schedule.spec.total_bytes, hi=50)
        clusters: dict[CudaOptions, OneGpuCluster] = {}
        for mode in modes:
            opts = CudaOptions(**choice.options(mode))
            if opts not in clusters:
                clusters[opts] = OneGpuCluster(case.schedule.expand(), opts)
            timing = time_one_gpu(clusters[opts], Mode(mode), iters)
            # the lowering's knobs, as multi-GPU rows carry them: calibrate times the rows the
            # kernel ran (forwarded copies, merged rows), not the plan as written
            rows.append(make_row(case.schedule, BackendName.CUDA.value, Mode(mode),
                                 case.topology_name, timing, one_gpu=True,
                                 options=choice.options(mode)).to_json())
            if not args.json:
                _print_row(rows[-1])
        del clusters
    _report(rows, runnable, runnable[0].schedule.world_size, args)
    return 0
