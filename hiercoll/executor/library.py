"""The `nccl` pseudo-backend: the collective as one torch.distributed library call.

It ignores the schedule's ops and runs `spec` directly, so every benchmark gets its NCCL row from
the same harness, and the auto-picker can fall back to the library where it wins. With a gloo
process group the same calls run on CPU (what CI tests). Cases the library cannot express exactly
(uneven reduce-scatter/all-gather shards, avg on gloo) are lowered to an equivalent call and the
choice is recorded in `Prepared.notes`: nothing is silently substituted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hiercoll.collectives import CollectiveSpec, Kind, ReduceOp
from hiercoll.errors import HiercollError
from hiercoll.executor.interface import (
    BackendName,
    Prepared,
    ProcessGroupBackend,
    RunResult,
    check_launch,
    check_tensor,
)
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.schedule import Schedule

Call = Callable[[torch.Tensor, torch.Tensor], None]

# torch 2.13 renames the single-tensor collectives (the old names warn); 2.11 has only the old ones.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_OPS = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.MAX: dist.ReduceOp.MAX,
        ReduceOp.MIN: dist.ReduceOp.MIN}


@dataclass(kw_only=True)
class LibraryPrepared(Prepared):
    group: Any                 # the torch process group (None: WORLD)
    call: Call
    device_type: str           # where user tensors live: cuda under nccl, cpu under gloo
    process_group: str = ""    # torch's backend of the group the calls go through

    @property
    def ran_on(self) -> str:
        return self.process_group or self.backend.value


class LibraryBackend:
    """`nccl` on CUDA process groups; the same calls through gloo on CPU."""

    name = BackendName.NCCL

    def prepare(self, schedule: Schedule, group: Any = None) -> LibraryPrepared:
        world = dist.get_world_size(group)
        check_launch(schedule, world)
        backend = str(dist.get_backend(group))
        device_type = "cuda" if backend == ProcessGroupBackend.NCCL else "cpu"
        notes: list[str] = []
        call = _lower(schedule.spec, group, backend, notes)
        return LibraryPrepared(schedule, dist.get_rank(group), world, self.name, notes,
                               group=group, call=call, device_type=device_type,
                               process_group=backend)

    def run(self, prepared: Prepared, input: torch.Tensor, output: torch.Tensor) -> RunResult:
        assert isinstance(prepared, LibraryPrepared)
        spec, rank = prepared.schedule.spec, prepared.rank
        dtype = torch_dtype(spec.dtype)
        check_tensor("input", input, spec.input_count(rank), dtype, prepared.device_type)
        check_tensor("output", output, spec.output_count(rank), dtype, prepared.device_type)
        prepared.call(input, output)
        return RunResult(self.name, rank, output)


def _reduce_op(op: ReduceOp, backend: str, world: int, notes: list[str]) -> tuple[Any, float]:
    """The library op and a post-scale (avg as sum * 1/W where the backend lacks AVG)."""
    if op == ReduceOp.AVG:
        if backend == ProcessGroupBackend.NCCL:
            return dist.ReduceOp.AVG, 1.0
        notes.append(f"{backend} has no AVG: sum, then scale by 1/{world}")
        return dist.ReduceOp.SUM, 1.0 / world
    return _OPS[op], 1.0


def library_call(spec: CollectiveSpec, group: Any) -> Call:
    """`call(input, output)`: the library collective for `spec` over `group` (NCCL on a CUDA
    group, gloo on CPU), what `LibraryBackend.prepare` runs, without a schedule: the
    Communicator calls it on its caller's own tensors (no staging copies)."""
    return _lower(spec, group, str(dist.get_backend(group)), [])


def _lower(spec: CollectiveSpec, group: Any, backend: str, notes: list[str]) -> Call:
    kind = spec.kind
    if kind == Kind.ALL_REDUCE:
        return _all_reduce(spec, group, backend, notes)
    if kind == Kind.REDUCE_SCATTER:
        return _reduce_scatter(spec, group, backend, notes)
    if kind == Kind.ALL_GATHER:
        return _all_gather(spec, group, notes)
    if kind == Kind.ALL_TO_ALL:
        return lambda inp, out: dist.all_to_all_single(out, inp, group=group)
    if kind in (Kind.BROADCAST, Kind.REDUCE):
        return _rooted(spec, group, backend, notes)
    raise HiercollError(f"--backend nccl: {kind} has no single library call; run it with "
                        "--backend cuda or gloo")


def _all_reduce(spec: CollectiveSpec, group: Any, backend: str, notes: list[str]) -> Call:
    op, post = _reduce_op(spec.reduce_op, backend, spec.world_size, notes)

    def all_reduce(inp: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(inp)
        dist.all_reduce(out, op=op, group=group)
        if post != 1.0:
            out.mul_(post)
    return all_reduce


def _reduce_scatter(spec: CollectiveSpec, group: Any, backend: str, notes: list[str]) -> Call:
    op, post = _reduce_op(spec.reduce_op, backend, spec.world_size, notes)
    if spec.count % spec.world_size:
        notes.append("uneven shards: all_reduce of the whole buffer, then this rank's shard")
        off, n = spec.shard(dist.get_rank(group))

        def rs_uneven(inp: torch.Tensor, out: torch.Tensor) -> None:
            tmp = inp.clone()
            dist.all_reduce(tmp, op=op, group=group)
            out.copy_(tmp[off:off + n])
            if post != 1.0:
                out.mul_(post)
        return rs_uneven

    def reduce_scatter(inp: torch.Tensor, out: torch.Tensor) -> None:
        reduce_scatter_single(out, inp, op=op, group=group)
        if post != 1.0:
            out.mul_(post)
    return reduce_scatter


def _all_gather(spec: CollectiveSpec, group: Any, notes: list[str]) -> Call:
    w = spec.world_size
    if spec.count % w == 0:
        return lambda inp, out: all_gather_single(out, inp, group=group)
    notes.append("uneven shards: all_gather of shards padded to the largest, then unpacked")
    shards = [spec.shard(r) for r in range(w)]
    width = max(n for _, n in shards)

    def ag_uneven(inp: torch.Tensor, out: torch.Tensor) -> None:
        padded = torch.zeros(width, dtype=inp.dtype, device=inp.device)
        padded[:inp.numel()].copy_(inp)
        gathered = torch.empty(width * w, dtype=inp.dtype, device=inp.device)
        all_gather_single(gathered, padded, group=group)
        for r, (o, n) in enumerate(shards):
            out[o:o + n].copy_(gathered[r * width:r * width + n])
    return ag_uneven


def _rooted(spec: CollectiveSpec, group: Any, backend: str, notes: list[str]) -> Call:
    rank = dist.get_rank(group)
    root = dist.get_global_rank(group, spec.root) if group is not None else spec.root
    if spec.kind == Kind.BROADCAST:
        def broadcast(inp: torch.Tensor, out: torch.Tensor) -> None:
            if rank == spec.root:
                out.copy_(inp)
            dist.broadcast(out, src=root, group=group)
        return broadcast
    op, post = _reduce_op(spec.reduce_op, backend, spec.world_size, notes)

    def reduce(inp: torch.Tensor, out: torch.Tensor) -> None:
        tmp = inp.clone()
        dist.reduce(tmp, dst=root, op=op, group=group)
        if rank == spec.root:
            out.copy_(tmp)
            if post != 1.0:
                out.mul_(post)
    return reduce
