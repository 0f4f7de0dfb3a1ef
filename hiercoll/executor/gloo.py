"""The gloo backend: CPU tensors, one process per rank, torch.distributed send/recv.

Every rank walks the same global layering of the schedule (`order.levels`). For each level, the
owner of every source region that lives away from its op's destination sends it with
`batch_isend_irecv`; the destination's owner receives it, then runs the op locally (copy, or a
reduce accumulated in fp32/fp64 and rounded once). Ops of one level are independent, so one batch
per level is enough and no order of sends can deadlock. Who *issues* an op does not matter here:
data moves from the owner of the source to the owner of the destination.

Every wait is bounded by the process group's timeout (`hiercoll run/stress --timeout`): a rank
whose peer stopped or died raises one line naming itself, the op and the peer it waits for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hiercoll.collectives import ReduceOp
from hiercoll.errors import HiercollError
from hiercoll.executor.interface import BackendName, Prepared, RunResult, check_launch, check_tensor
from hiercoll.executor.order import levels
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.schedule import INPUT, OUTPUT, Op, OpKind, Region, Schedule


@dataclass(frozen=True)
class _Recv:
    """Source `index` of `op` arrives from rank `peer` into a temporary."""

    op: Op
    index: int
    peer: int
    tag: int


@dataclass(frozen=True)
class _Send:
    region: Region
    peer: int
    tag: int
    op_id: str = ""              # the op this source feeds (for error messages)


@dataclass(frozen=True)
class _Step:
    """This rank's part of one level: what it sends, receives, then computes."""

    sends: tuple[_Send, ...]
    recvs: tuple[_Recv, ...]
    local_ops: tuple[Op, ...]     # ops whose destination lives on this rank


DEFAULT_TIMEOUT_S = 300.0     # when the process group does not say (hiercoll run's default)


@dataclass
class GlooPrepared(Prepared):
    group: Any = None
    steps: tuple[_Step, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    scratch: dict[str, torch.Tensor] = field(default_factory=dict)


def _tag(op_ordinal: int, src_index: int, max_srcs: int) -> int:
    return op_ordinal * max_srcs + src_index


def lower_for_rank(schedule: Schedule, rank: int) -> tuple[_Step, ...]:
    """The per-level sends/recvs/local ops of `rank` (pure; tested without processes)."""
    layered = levels(schedule)
    max_srcs = 1 + max((len(op.srcs) for lv in layered.levels for op in lv), default=1)
    steps: list[_Step] = []
    ordinal = 0
    for level in layered.levels:
        sends: list[_Send] = []
        recvs: list[_Recv] = []
        local: list[Op] = []
        for op in level:
            ordinal += 1
            if op.dst.count == 0:
                continue
            owner = op.dst.rank
            for i, src in enumerate(op.srcs):
                if src.rank == owner:
                    continue
                tag = _tag(ordinal, i, max_srcs)
                if src.rank == rank:
                    sends.append(_Send(src, owner, tag, op.id))
                if owner == rank:
                    recvs.append(_Recv(op, i, src.rank, tag))
            if owner == rank:
                local.append(op)
        if sends or recvs or local:
            steps.append(_Step(tuple(sends), tuple(recvs), tuple(local)))
    return tuple(steps)


class GlooBackend:
    name = BackendName.GLOO

    def prepare(self, schedule: Schedule, group: Any = None) -> GlooPrepared:
        world = dist.get_world_size(group)
        check_launch(schedule, world)
        rank = dist.get_rank(group)
        dtype = torch_dtype(schedule.spec.dtype)
        scratch = {name: torch.full((n,), float("nan"), dtype=dtype)
                   for name, n in schedule.buffers(rank).items() if name not in (INPUT, OUTPUT)}
        steps = lower_for_rank(schedule, rank)
        timeout_s = group_timeout_s(group)
        try:
            dist.barrier(group)
        except RuntimeError as exc:
            raise HiercollError(f"rank {rank}: the barrier before the first call failed or timed "
                                f"out (after at most {timeout_s:g} s) waiting for the other ranks: "
                                f"{_first_line(exc)}") from None
        return GlooPrepared(schedule, rank, world, self.name, group=group, steps=steps,
                            scratch=scratch, timeout_s=timeout_s)

    def run(self, prepared: Prepared, input: torch.Tensor, output: torch.Tensor) -> RunResult:
        assert isinstance(prepared, GlooPrepared)
        spec, rank = prepared.schedule.spec, prepared.rank
        dtype = torch_dtype(spec.dtype)
        check_tensor("input", input, spec.input_count(rank), dtype, "cpu")
        check_tensor("output", output, spec.output_count(rank), dtype, "cpu")
        bufs = dict(prepared.scratch)
        bufs[INPUT], bufs[OUTPUT] = input, output
        group = prepared.group
        for step in prepared.steps:
            temps = self._exchange(step, bufs, dtype, group, rank, prepared.timeout_s)
            for op in step.local_ops:
                if op.kind == OpKind.COPY and len(op.srcs) == 1 and op.srcs[0].rank != rank:
                    continue            # received straight into its destination
                srcs = [temps.get((op.ref, i)) if s.rank != rank else _view(bufs, s)
                        for i, s in enumerate(op.srcs)]
                _apply(op, srcs, _view(bufs, op.dst), spec.reduce_op)
        return RunResult(self.name, rank, output)

    @staticmethod
    def _exchange(step: _Step, bufs: dict[str, torch.Tensor], dtype: torch.dtype,
                  group: Any, rank: int, timeout_s: float,
                  ) -> dict[tuple[tuple[int, int], int], torch.Tensor]:
        p2p: list[dist.P2POp] = []
        waits: list[tuple[str, int, str]] = []        # (op id, peer, "waiting for"/"sending to")
        temps: dict[tuple[tuple[int, int], int], torch.Tensor] = {}
        for r in step.recvs:
            # a copy's one remote source lands in its destination directly (no staging and no
            # second copy); a reduce's sources are staged, combined, rounded once
            direct = r.op.kind == OpKind.COPY and len(r.op.srcs) == 1
            t = _view(bufs, r.op.dst) if direct else torch.empty(r.op.dst.count, dtype=dtype)
            temps[(r.op.ref, r.index)] = t
            p2p.append(dist.P2POp(dist.irecv, t, _global(group, r.peer), group, r.tag))
            waits.append((r.op.id, r.peer, "waiting for"))
        for s in step.sends:
            p2p.append(dist.P2POp(dist.isend, _view(bufs, s.region), _global(group, s.peer),
                                  group, s.tag))
            waits.append((s.op_id, s.peer, "sending to"))
        if not p2p:
            return temps
        deadline = time.monotonic() + timeout_s
        try:
            works = dist.batch_isend_irecv(p2p)
        except RuntimeError as exc:
            op_id, peer, what = waits[0]
            raise HiercollError(f"rank {rank}: op {op_id} failed {what} rank {peer}: "
                                f"{_first_line(exc)}") from None
        for (op_id, peer, what), work in zip(waits, works):   # receives first: the usual culprit
            left = max(deadline - time.monotonic(), 0.001)
            try:
                done = work.wait(timedelta(seconds=left))
            except RuntimeError as exc:
                done = False
                if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
                    raise HiercollError(f"rank {rank}: op {op_id} failed {what} rank {peer} "
                                        f"(it stopped or died?): {_first_line(exc)}") from None
            if done is False:
                raise HiercollError(f"rank {rank}: op {op_id} timed out after {timeout_s:g} s "
                                    f"{what} rank {peer}") from None
        return temps


def group_timeout_s(group: Any = None) -> float:
    """The process group's collective timeout, in seconds (set by init_process_group)."""
    try:
        pg: Any = group if group is not None else dist.group.WORLD
        return float(pg._get_backend(torch.device("cpu")).options._timeout.total_seconds())
    except (AttributeError, RuntimeError, ValueError):
        return DEFAULT_TIMEOUT_S


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _global(group: Any, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _view(bufs: dict[str, torch.Tensor], region: Region) -> torch.Tensor:
    return bufs[region.buffer][region.offset:region.offset + region.count]


def _apply(op: Op, srcs: list[torch.Tensor | None], dst: torch.Tensor, reduce_op: ReduceOp) -> None:
    """dst <- src (copy) or dst <- [dst +] scale * combine(srcs), rounded once."""
    assert all(s is not None for s in srcs), f"op {op.id}: a source never arrived"
    if op.kind == OpKind.COPY:
        dst.copy_(srcs[0])  # type: ignore[arg-type]
        return
    acc_dtype = accumulate_dtype_for(dst.dtype)
    acc = srcs[0].to(acc_dtype, copy=True)  # type: ignore[union-attr]
    for s in srcs[1:]:
        # in place, the source promoted inside the kernel: no widened copy of each source (the
        # copies and temporaries were half of a 16 MiB call's CPU time)
        if reduce_op == ReduceOp.MAX:
            torch.maximum(acc, s, out=acc)  # type: ignore[arg-type]
        elif reduce_op == ReduceOp.MIN:
            torch.minimum(acc, s, out=acc)  # type: ignore[arg-type]
        else:
            acc.add_(s)  # type: ignore[arg-type]
    if op.scale != 1.0:
        acc.mul_(op.scale)
    if op.accumulate:
        acc.add_(dst)
    dst.copy_(acc)


def accumulate_dtype_for(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
