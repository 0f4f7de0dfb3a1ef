"""`hiercoll stress --fused-rmsnorm`: the fused all-reduce + residual add + RMSNorm against the
unfused reference over the 13 decode/prefill shapes x hidden {2880, 4096}, bf16.

    hiercoll stress --fused-rmsnorm --one-gpu --world 4 --iters 2000 --modes eager,graph
    torchrun --nproc-per-node 8 -m hiercoll stress --fused-rmsnorm --backend cuda --iters 2000
    torchrun --nproc-per-node 2 -m hiercoll stress --fused-rmsnorm --backend gloo --iters 3

Exit 1 if any shape's max-abs error exceeds 0.5 (or ranks disagree); the report names the first
bad iteration. gloo runs the unfused fallback (the harness end to end on CPU).
"""

from __future__ import annotations

import argparse
from typing import Any

from hiercoll.errors import HiercollError
from hiercoll.units import parse_size


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fused-rmsnorm", action="store_true",
                   help="stress the fused all-reduce + residual add + RMSNorm (shapes: --shapes "
                   "M values, default the 13 of the regression; --hidden)")
    p.add_argument("--world", type=int, default=None,
                   help="--fused-rmsnorm: ranks (--one-gpu: in this process, default 4; "
                   "torchrun: must match the launch)")
    p.add_argument("--stage", default="auto", choices=["auto", "0", "1", "2", "3"],
                   help="--fused-rmsnorm: force the 1-stage or 2-stage kernel, 3: the LL form "
                   "(small calls: flagged-word pushes, no barrier), or 0: the unfused fallback "
                   "(NCCL all-reduce + add + RMSNorm)")
    p.add_argument("--large-iters", type=int, default=200,
                   help="--fused-rmsnorm: iterations for shapes above 4.7 MB (the seed's "
                   "regression: --iters up to 4.7 MB, this above; default 200)")
    p.add_argument("--drop-ordering", default=None, choices=sorted(DROPS),
                   help="--fused-rmsnorm: a test of the test: run the kernel with one memory-"
                   "ordering rule removed; the stress must then FAIL (exit 1) where the "
                   "hardware exposes it")


# the seed's negatives: the kernel with one ordering rule removed
DROPS = {"release": {"release": False}, "acquire": {"acquire": False},
         "all-threads-acquire": {"acquire_all_threads": False}}
LARGE_BYTES = 4.7e6     # above this the seed's regression runs --large-iters


def iterations(args: argparse.Namespace, rows: int, hidden: int) -> int:
    """--iters, or --large-iters for a shape above 4.7 MB of bf16."""
    return args.iters if rows * hidden * 2 <= LARGE_BYTES else min(args.iters, args.large_iters)


def _ordering(args: argparse.Namespace) -> Any:
    from hiercoll.kernels.fused_norm_abi import Ordering
    return Ordering(**DROPS[args.drop_ordering]) if args.drop_ordering else Ordering()


def _rows(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    from hiercoll.harness.fused_norm_stress import HIDDEN, SHAPES
    if args.sizes:
        raise HiercollError("--sizes: --fused-rmsnorm takes --shapes (rows) and --hidden")
    ms = [parse_size(m, "--shapes") for m in args.shapes.split(",")] if args.shapes else list(SHAPES)
    hs = [parse_size(h, "--hidden") for h in args.hidden.split(",")] if args.hidden else list(HIDDEN)
    for m in ms:
        if m < 1:
            raise HiercollError(f"--shapes: {m} rows; give positive row counts")
    for h in hs:
        if not 1 <= h <= 16384:
            raise HiercollError(f"--hidden: {h} must be in 1..16384")
    return ms, hs


def run_fused(args: argparse.Namespace, modes: list[str]) -> list[dict[str, Any]] | None:
    """The reports (rank 0 or the one process), None on other ranks."""
    if args.plan or args.collective:
        raise HiercollError("--fused-rmsnorm: takes no plan file or --collective; it has its own "
                            "shapes (--shapes, --hidden)")
    if args.dtype not in (None, "bf16"):
        raise HiercollError("--dtype: --fused-rmsnorm runs bf16 (the regression's dtype)")
    ms, hs = _rows(args)
    stage = None if args.stage == "auto" else int(args.stage)
    if stage == 3:
        from hiercoll.kernels.fused_norm_abi import LL_MAX_ELEMENTS, ll_applies
        too_big = [f"{m}x{h}" for h in hs for m in ms if not ll_applies(m, h, 2)]
        if too_big:
            raise HiercollError(f"--stage 3: the LL form takes an even hidden and at most "
                                f"{LL_MAX_ELEMENTS} elements a call; {', '.join(too_big)} do not "
                                "fit: pass --shapes within it")
    if args.one_gpu:
        return _one_gpu(args, modes, ms, hs, stage)
    return _group(args, modes, ms, hs, stage)


def _print(r: dict[str, Any]) -> None:
    print(f"{'ok  ' if r['ok'] else 'FAIL'} fused-rmsnorm M={r['rows']:>5} H={r['hidden']} "
          f"W={r['world']} stage {r['stage']} {r['mode']:5} iters {r['iterations']:5} "
          f"max|err| {r['max_abs_error']:.4g} (bound {r['bound']})"
          + ("" if r["first_bad_iteration"] is None
             else f" first bad iteration {r['first_bad_iteration']}")
          + ("" if r["ranks_identical"] else " ranks differ"), flush=True)


def _one_gpu(args: argparse.Namespace, modes: list[str], ms: list[int], hs: list[int],
             stage: int | None) -> list[dict[str, Any]]:
    from hiercoll.cli.backend_args import need_one_gpu
    from hiercoll.harness.launch import set_safe_cuda_env
    if args.backend != "cuda":
        raise HiercollError("--one-gpu: needs --backend cuda")
    world = args.world or 4
    if not 1 <= world <= 8:
        raise HiercollError(f"--world: {world} ranks on one GPU; use 1..8")
    set_safe_cuda_env()
    need_one_gpu()
    from hiercoll.executor.cuda.lowering import spin_limit_for
    from hiercoll.harness.fused_norm_stress import stress_one_gpu
    from hiercoll.torch.reference import unfused_add_rms_norm
    spin = spin_limit_for(args.debug_timeout_ms)
    out = []
    for h in hs:
        for m in ms:
            for mode in modes:
                r = stress_one_gpu(unfused_add_rms_norm, world, m, h, iterations(args, m, h),
                                   mode, seed=args.seed, stage=stage, spin_limit=spin,
                                   max_seconds=args.max_seconds, ordering=_ordering(args)
                                   ).to_json()
                if not args.json:
                    _print(r)
                out.append(r)
    return out


def _group(args: argparse.Namespace, modes: list[str], ms: list[int], hs: list[int],
           stage: int | None) -> list[dict[str, Any]] | None:
    from hiercoll.cli.backend_args import device_type
    from hiercoll.harness.launch import init_from_env, peer_failures, shutdown
    if args.backend not in ("cuda", "gloo"):
        raise HiercollError("--fused-rmsnorm: --backend cuda (the fused kernel) or gloo (the "
                            "unfused fallback on CPU)")
    if args.backend == "gloo" and "graph" in modes:
        raise HiercollError("--modes graph: needs --backend cuda (CUDA graphs)")
    launch = init_from_env(device_type(args.backend), args.timeout)
    try:
        with peer_failures(launch.rank):
            if args.world is not None and args.world != launch.world_size:
                raise HiercollError(f"--world: {args.world} but the launch has {launch.world_size} "
                                    f"ranks; torchrun --nproc-per-node {args.world} ...")
            from hiercoll.executor.cuda.lowering import spin_limit_for
            from hiercoll.harness.fused_norm_stress import stress_group
            from hiercoll.torch.reference import unfused_add_rms_norm
            spin = spin_limit_for(args.debug_timeout_ms)
            out = []
            for h in hs:
                for m in ms:
                    for mode in modes:
                        r = stress_group(unfused_add_rms_norm, m, h, iterations(args, m, h),
                                         mode, seed=args.seed, stage=stage, spin_limit=spin,
                                         ordering=_ordering(args)).to_json()
                        if launch.rank == 0 and not args.json:
                            _print(r)
                        out.append(r)
    finally:
        shutdown()
    return out if launch.rank == 0 else None
