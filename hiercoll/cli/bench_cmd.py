"""`hiercoll bench`: time algorithms (and the NCCL library call) per size, eager and graph mode.

    torchrun --nproc-per-node 4 -m hiercoll bench --collective all_reduce --topology h200x4 \
        --sizes 8KiB:1GiB --algorithms ring,direct,two_shot,nccl --modes eager,graph --out DIR

Writes DIR/<collective>-w<W>.json (long-form rows + command, versions, date, machine),
DIR/<collective>-w<W>.md (a table) and DIR/<collective>-w<W>.png (busbw versus size).
"""

from __future__ import annotations

import argparse
from typing import Any

from hiercoll.cli.common import add_json_flag, print_json, print_table
from hiercoll.cli.run_cmd import (BACKENDS, add_cuda_args, backend_options, device_type,
                                  prepare_for_mode)
from hiercoll.errors import HiercollError
from hiercoll.units import format_size, parse_size_range


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="benchmark algorithms against the NCCL library call")
    p.add_argument("plan", nargs="?", default=None, help="plan file (or use --collective ...)")
    p.add_argument("--backend", default="cuda", choices=BACKENDS)
    p.add_argument("--collective", "-c", default=None)
    p.add_argument("--topology", "-t", default=None)
    p.add_argument("--nodes", "-n", type=int, default=None)
    p.add_argument("--algorithms", default=None, help="comma list; 'nccl' is the library call")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32", "fp64"])
    p.add_argument("--reduce-op", default=None, choices=["sum", "avg", "max", "min"])
    p.add_argument("--sizes", default="8KiB:1GiB", help="LOW:HIGH[:FACTOR] or a,b,c")
    p.add_argument("--modes", default="eager,graph")
    p.add_argument("--iters", type=int, default=None, help="timed calls per point (default by size)")
    p.add_argument("--out", default=None, help="directory for JSON/MD/PNG results (rank 0)")
    p.add_argument("--zero-copy", action="store_true",
                   help="cuda: run on the symmetric buffers (time the collective without the "
                   "copy-in/copy-out of user tensors)")
    add_cuda_args(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hiercoll.harness.sweep import cases_from_args
    sizes = parse_size_range(args.sizes)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in ("eager", "graph") for m in modes):
        raise HiercollError(f"--modes: {args.modes!r} should list eager and/or graph")
    cases = cases_from_args(args, sizes)
    backend_options(args)
    from hiercoll.harness.launch import init_from_env, shutdown
    launch = init_from_env(device_type(args.backend))
    if launch.device.type != "cuda" and "graph" in modes:
        modes = [m for m in modes if m != "graph"]
    rows: list[dict[str, Any]] = []
    try:
        for case in cases:
            for row in _bench_case(case, modes, launch, args):
                rows.append(row)
                if launch.rank == 0 and not args.json:
                    print(f"{row['algorithm']:>10} {row['mode']:5} {format_size(row['nbytes']):>8} "
                          f"p50 {row['p50_us']:9.1f} us  busbw {row['busbw_gbps']:7.1f} GB/s",
                          flush=True)
    finally:
        shutdown()
    if launch.rank == 0:
        if args.out:
            from hiercoll.harness.results import write_results
            write_results(args.out, rows, launch.world_size)
        if args.json:
            print_json({"rows": rows})
        else:
            cols = ["algorithm", "mode", "bytes", "p50 us", "p90 us", "p99 us", "busbw GB/s"]
            print_table(f"{cases[0].schedule.spec.kind.value} on {launch.world_size} ranks", cols,
                        [[r["algorithm"], r["mode"], format_size(r["nbytes"]), r["p50_us"],
                          r["p90_us"], r["p99_us"], r["busbw_gbps"]] for r in rows])
    return 0


def _bench_case(case, modes: list[str], launch, args: argparse.Namespace) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """One prepare (one set of symmetric allocations) per case and lowering: graph mode takes
    the single-stream lowering (`backend_options`)."""
    from hiercoll.harness.bench import iterations_for, make_row, time_run
    from hiercoll.executor.interface import BackendName, Mode, check_launch
    check_launch(case.schedule, launch.world_size)
    spec = case.schedule.spec
    iters = args.iters or iterations_for(spec.nbytes)
    rows: list[dict[str, Any]] = []
    cache: dict[Any, tuple[Any, Any]] = {}
    for mode in modes:
        backend, prepared = prepare_for_mode(case.schedule, args, mode, cache)
        zero_copy = args.zero_copy and prepared.backend == BackendName.CUDA
        timing = time_run(backend, prepared, launch.device, Mode(mode), iters, zero_copy=zero_copy)
        rows.append(make_row(spec, case.algorithm, prepared.backend.value, Mode(mode),
                             case.topology_name, timing, zero_copy=zero_copy).to_json())
    return rows
