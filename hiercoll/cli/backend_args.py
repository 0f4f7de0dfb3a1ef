"""The flags run, stress and bench share: which backend, and the cuda lowering's knobs.

The knobs are built from `CudaOptions`' fields (their metadata names the flag and its help), so a
new knob is declared once, in the lowering, and every command gets its flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from enum import Enum
from typing import Any

from hiercoll.cli.common import enum_choices
from hiercoll.collectives import DType, Kind, ReduceOp
from hiercoll.errors import HiercollError
from hiercoll.executor.cuda.lowering import CudaOptions
from hiercoll.executor.interface import BackendName
from hiercoll.harness.prepare import BackendChoice
from hiercoll.harness.sweep import SweepRequest
from hiercoll.units import format_size, parse_size

# What --backend accepts: every backend but the one-process numpy reference (`hiercoll verify`).
BACKEND_CHOICES = [b.value for b in BackendName if b != BackendName.REFERENCE]


def add_backend_arg(p: argparse.ArgumentParser, default: BackendName) -> None:
    p.add_argument("--backend", default=default.value, choices=BACKEND_CHOICES,
                   help="gloo: CPU processes; cuda: hiercoll's kernels on GPUs; nccl: the "
                   "library call for every case")


def add_cuda_args(p: argparse.ArgumentParser) -> None:
    """One flag per CudaOptions field: booleans that default on get `--no-...`, off `--...`;
    enums their choices; sizes take 64KiB-style values."""
    for f in dataclasses.fields(CudaOptions):
        flag, help_ = f.metadata["flag"], f.metadata["help"]
        metavar = flag.lstrip("-").replace("-", "_").upper()
        if isinstance(f.default, bool):
            p.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true",
                           default=f.default, help=help_)
        elif isinstance(f.default, Enum):
            p.add_argument(flag, dest=f.name, default=f.default.value, help=help_,
                           choices=enum_choices(type(f.default)))
        elif f.metadata["size"]:
            p.add_argument(flag, dest=f.name, default=format_size(int(f.default)), help=help_,
                           metavar=metavar)
        else:
            kind = float if isinstance(f.default, float) else int
            p.add_argument(flag, dest=f.name, type=kind, default=f.default, help=help_,
                           metavar=metavar)


def backend_choice(args: argparse.Namespace) -> BackendChoice:
    """The backend and its cuda options from the flags, validated before any process group
    starts, so a typo costs no launch."""
    name = BackendName(args.backend)
    if name != BackendName.CUDA:
        return BackendChoice(name, {})
    opts: dict[str, Any] = {}
    for f in dataclasses.fields(CudaOptions):
        value = getattr(args, f.name)
        opts[f.name] = parse_size(value, f.metadata["flag"]) if f.metadata["size"] else value
    CudaOptions(**opts)
    return BackendChoice(name, opts)


def device_type(backend: str) -> str:
    return "cpu" if backend == BackendName.GLOO else "cuda"


def sweep_request(args: argparse.Namespace, sizes: list[int] | None) -> SweepRequest:
    """stress/bench: the cases to run, from a plan file or --collective/--topology."""
    return SweepRequest(plan=args.plan, collective=args.collective, topology=args.topology,
                        nodes=args.nodes, algorithms=args.algorithms, dtype=args.dtype,
                        reduce_op=args.reduce_op, sizes=sizes)


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    """stress/bench: a plan file, or a collective on a topology, and the overrides."""
    p.add_argument("plan", nargs="?", default=None, help="plan file (or use --collective ...)")
    p.add_argument("--collective", "-c", default=None, type=_collectives, metavar="KIND",
                   help="without a plan file: the collective, or a comma list run one after "
                   f"another in one process ({', '.join(enum_choices(Kind))})")
    p.add_argument("--topology", "-t", default=None, help="preset or file (without a plan file)")
    p.add_argument("--nodes", "-n", type=int, default=None,
                   help="node count of a preset topology (default: the preset's)")
    p.add_argument("--algorithms", default=None,
                   help="comma list (default: the plan's, or every applicable algorithm); "
                   "'nccl' is the library call")
    p.add_argument("--dtype", default=None, choices=enum_choices(DType),
                   help="element type (default: the plan's, else bf16)")
    p.add_argument("--reduce-op", default=None, choices=enum_choices(ReduceOp),
                   help="reduction (default: the plan's, else sum)")


def _collectives(text: str) -> str:
    """--collective: one collective or a comma list of them, each a known kind."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in enum_choices(Kind)]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(
            f"{', '.join(bad) or repr(text)}: choose from {', '.join(enum_choices(Kind))}")
    return ",".join(kinds)


def need_one_gpu() -> None:
    """--one-gpu: a visible CUDA GPU and triton, or one line saying which is missing."""
    import importlib.util

    import torch
    if not torch.cuda.is_available():
        raise HiercollError("--one-gpu: needs a CUDA GPU and none is visible; on CPU use "
                            "torchrun ... stress --backend gloo")
    if importlib.util.find_spec("triton") is None:
        raise HiercollError("--one-gpu: the cuda backend's kernels need triton; pip install "
                            "triton (it comes with CUDA builds of torch)")
