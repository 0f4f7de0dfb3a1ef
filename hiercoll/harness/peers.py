"""What users run instead of hiercoll, timed by the same harness in the same run: NCCL's
collective called as nccl-tests calls it (in place for all-reduce, no copies around it) and
torch's symmetric-memory kernels (one-shot and two-shot all-reduce, reduce-scatter).

Why here: a ratio against a number measured in another run, on another day or by another
timer, is not a ratio. Each peer is a callable on tensors it owns (symmetric where torch needs
it), so `hiercoll bench` times it exactly as it times a plan: eager back-to-back calls, or a
CUDA graph of several calls (bench.time_call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hiercoll.collectives import CollectiveSpec, Kind, ReduceOp
from hiercoll.executor.cuda.symm import torch_symm_fits
from hiercoll.executor.library import all_gather_single, reduce_scatter_single


@dataclass
class Peer:
    name: str
    call: Callable[[], None]
    note: str
    result: torch.Tensor | None = None   # where a call leaves its output (fused-norm's unfused rows)


def peers_for(spec: CollectiveSpec, names: tuple[str, ...], device: torch.device,
              dtype: torch.dtype, group: Any = None) -> list[Peer]:
    """The peers of `names` that can run `spec` here (others are left out: each kernel's own
    limits). Collective: every rank builds the same list in the same order (symmetric
    allocations are collective)."""
    out = []
    for name in names:
        peer = _build(name, spec, device, dtype, group)
        if peer is not None:
            out.append(peer)
    return out


def _build(name: str, spec: CollectiveSpec, device: torch.device, dtype: torch.dtype,
           group: Any) -> Peer | None:
    w, rank = spec.world_size, dist.get_rank(group)
    n_in, n_out = spec.input_count(rank), spec.output_count(rank)
    if name == "nccl":
        return _nccl(spec, device, dtype, group, n_in, n_out)
    symm_ok = (spec.reduce_op == ReduceOp.SUM
               and torch_symm_fits(spec.count * spec.dtype.itemsize, dtype, w))
    if not symm_ok:
        return None
    if name in ("torch-one-shot", "torch-two-shot") and spec.kind == Kind.ALL_REDUCE:
        buf, group_name = _symmetric(n_in, dtype, device, group)
        out = torch.empty(n_out, dtype=dtype, device=device)
        if name == "torch-one-shot":
            return Peer(name, lambda: torch.ops.symm_mem.one_shot_all_reduce_out(
                buf, "sum", group_name, out), "symm_mem.one_shot_all_reduce_out", out)
        return Peer(name, lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group_name),
                    "symm_mem.two_shot_all_reduce_ (in place)", buf)
    if name == "torch-reduce-scatter" and spec.kind == Kind.REDUCE_SCATTER:
        buf, group_name = _symmetric(n_in, dtype, device, group)
        out = torch.empty(n_out, dtype=dtype, device=device)
        return Peer(name, lambda: torch.ops.symm_mem.reduce_scatter_out(
            buf, group_name, False, out), "symm_mem.reduce_scatter_out")
    return None


def _nccl(spec: CollectiveSpec, device: torch.device, dtype: torch.dtype, group: Any,
          n_in: int, n_out: int) -> Peer | None:
    inp = torch.randn(n_in, device=device).to(dtype)
    out = torch.empty(n_out, dtype=dtype, device=device)
    if spec.kind == Kind.ALL_REDUCE:
        return Peer("nccl", lambda: dist.all_reduce(inp, group=group), "all_reduce in place", inp)
    if spec.kind == Kind.REDUCE_SCATTER and spec.count % spec.world_size == 0:
        return Peer("nccl", lambda: reduce_scatter_single(out, inp, group=group),
                    "reduce_scatter_tensor")
    if spec.kind == Kind.ALL_GATHER and spec.count % spec.world_size == 0:
        return Peer("nccl", lambda: all_gather_single(out, inp, group=group),
                    "all_gather_into_tensor")
    if spec.kind == Kind.ALL_TO_ALL:
        return Peer("nccl", lambda: dist.all_to_all_single(out, inp, group=group),
                    "all_to_all_single")
    return None


def _symmetric(numel: int, dtype: torch.dtype, device: torch.device,
               group: Any) -> tuple[torch.Tensor, str]:
    from hiercoll.executor.cuda.symm import allocate, process_group
    sym = allocate(numel, dtype, device, group)
    sym.tensor.normal_()
    return sym.tensor, process_group(group).group_name
