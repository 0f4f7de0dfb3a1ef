"""Host side of the fused all-reduce + residual add + RMSNorm: buffers, signals, stage choice,
launch; for one rank per process over a process group (symmetric memory), and for every rank of
one GPU in one process (`OneGpuFusedNorm`: the ranks' buffers are slabs of one allocation, each
rank launches on its own stream so the ranks really run side by side and wait on each other).

`fused_add_rms_norm(ctx, x, residual, weight, eps)` is what `hiercoll.torch.Communicator` calls.
`ctx` gives `.rank`, `.world_size`, `.group`, `.device` and `.symmetric(nbytes)`: a collective
allocation (same order on every rank, never freed) returning an object with `.tensor` (this
rank's bytes) and `.base_ptrs` (every rank's address), as `symm.SymmetricTensor` does.
`GroupContext` is such a ctx over a torch process group.

Why the state is per ctx and fixed: the signal slots and per-CTA call counters must stay the same
for the life of the group (the counters are the epoch every rank's CTA agrees on); the data buffer
grows (a new collective allocation) when a call needs more rows than fit, which must therefore
not happen inside a CUDA-graph capture: call `reserve` first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hiercoll.errors import HiercollError
from hiercoll.executor.cuda.one_gpu import Slab, slabs
from hiercoll.executor.cuda.symm import (
    SymmetricBuffer,
    allocate,
    deltas,
    process_group,
    torch_symm_fits,
)
from hiercoll.kernels.fused_norm import FusedNormState, launch
from hiercoll.kernels.fused_norm_abi import (
    ERR_WORDS,
    LL_STAGE,
    REGIONS,
    SAFE,
    Ordering,
    ll_applies,
    ll_area_words,
    ll_max_rows,
    num_slots,
    parts,
)
from hiercoll.sim.fused_norm_cost import CALIBRATED, FusedNormCosts, choose_stage

MAX_GRID = 128       # CTAs per call across GPUs, every call (the per-CTA counters need a fixed
                     # grid): enough loads in flight to fill NVLink; at most the GPU's SMs, since
                     # every CTA spins on its peers and all must be resident at once
ONE_GPU_GRID = 16    # one GPU: every rank's CTAs must be resident at once (W x 16 <= 132 SMs)
MAX_HIDDEN = 16384   # one row is one CTA's block
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class FusedNormContext(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def group(self) -> Any: ...

    @property
    def device(self) -> torch.device: ...

    def symmetric(self, nbytes: int) -> SymmetricBuffer: ...


@dataclass
class GroupContext:
    """A ctx over a torch process group (one rank per process), allocating with symm.allocate."""

    rank: int
    world_size: int
    group: Any
    device: torch.device

    def symmetric(self, nbytes: int) -> SymmetricBuffer:
        return allocate(max(nbytes, 16), torch.uint8, self.device, self.group)


def grid_for(device: torch.device) -> int:
    """CTAs per call of a rank on `device`: MAX_GRID, or fewer where the GPU has fewer SMs (a
    16-CTA grid took 448 us for 16 MiB on 4 H200s where 128 CTAs take 202: issue 26 and
    bench/results/gpu/fused_norm_multi/first). Every rank of a group must get the same number:
    the GPUs of one group are assumed alike."""
    if device.type != "cuda":
        return ONE_GPU_GRID
    return min(MAX_GRID, torch.cuda.get_device_properties(device).multi_processor_count)


def check_args(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """One line naming the argument and the fix (a HiercollError), before anything is launched."""
    if x.dim() != 2:
        raise HiercollError(f"fused_add_rms_norm: x must be [rows, hidden], got shape "
                            f"{tuple(x.shape)}; reshape it")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise HiercollError("fused_add_rms_norm: residual must have x's shape and dtype, got "
                            f"{tuple(residual.shape)} {residual.dtype}")
    if weight.shape != (x.shape[1],):
        raise HiercollError(f"fused_add_rms_norm: weight must be [{x.shape[1]}], got "
                            f"{tuple(weight.shape)}")
    if x.dtype not in DTYPES:
        raise HiercollError(f"fused_add_rms_norm: dtype {x.dtype} is not supported; use "
                            "bfloat16, float16 or float32")
    if not 0 < x.shape[1] <= MAX_HIDDEN:
        raise HiercollError(f"fused_add_rms_norm: hidden {x.shape[1]} must be in 1..{MAX_HIDDEN}")
    if not eps > 0:
        raise HiercollError(f"fused_add_rms_norm: eps {eps} must be > 0")


def _rank_state(buf: SymmetricBuffer, sig: SymmetricBuffer, ll: SymmetricBuffer,
                epoch: torch.Tensor, err: torch.Tensor, rank: int, world: int, grid: int,
                dtype: torch.dtype) -> FusedNormState:
    itemsize = torch.empty((), dtype=dtype).element_size()
    mine = buf.tensor.view(torch.uint8) if buf.tensor.dtype != torch.uint8 else buf.tensor
    usable = mine.numel() // (REGIONS * 16) * (REGIONS * 16)
    data = mine[:usable].view(dtype)
    dev = mine.device
    return FusedNormState(
        buf=data, buf_deltas=torch.tensor(deltas(buf, rank, itemsize), dtype=torch.int64, device=dev),
        sig=sig.tensor, sig_deltas=torch.tensor(deltas(sig, rank, 4), dtype=torch.int64, device=dev),
        epoch=epoch, err=err, rank=rank, world=world, grid=grid, stride=data.numel() // REGIONS,
        ll=_as_int64(ll.tensor), ll_deltas=torch.tensor(deltas(ll, rank, 8), dtype=torch.int64,
                                                        device=dev))


def _as_int64(t: torch.Tensor) -> torch.Tensor:
    """A byte (or any) allocation as its whole 8-byte words."""
    b = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return b[: b.numel() // 8 * 8].view(torch.int64)


@dataclass
class _Fused:
    """One rank's fused-norm state for a ctx (kept for the life of the process)."""

    ctx: Any
    grid: int
    sig: SymmetricBuffer
    ll: SymmetricBuffer         # the LL form's area (fixed size, allocated with the signals)
    epoch: torch.Tensor
    err: torch.Tensor
    buf: SymmetricBuffer | None = None
    states: dict[torch.dtype, FusedNormState] = field(default_factory=dict)
    # the unfused fallback's symmetric buffers for torch's two-shot all-reduce, per shape
    two_shot: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict)


_STATES: dict[int, _Fused] = {}


def _fused_for(ctx: FusedNormContext) -> _Fused:
    f = _STATES.get(id(ctx))
    if f is None or f.ctx is not ctx:
        grid = grid_for(ctx.device)
        sig = ctx.symmetric(4 * num_slots(grid, ctx.world_size))
        sig = _as_int32(sig)
        ll = ctx.symmetric(8 * ll_area_words(ctx.world_size))
        epoch = torch.zeros(grid, dtype=torch.int32, device=ctx.device)
        err = torch.zeros(ERR_WORDS, dtype=torch.int64, device=ctx.device)
        f = _STATES[id(ctx)] = _Fused(ctx, grid, sig, ll, epoch, err)
    return f


@dataclass
class _Int32View:
    inner: SymmetricBuffer

    @property
    def tensor(self) -> torch.Tensor:
        t = self.inner.tensor
        return t.view(torch.uint8)[: t.numel() * t.element_size() // 4 * 4].view(torch.int32)

    @property
    def base_ptrs(self) -> list[int]:
        return self.inner.base_ptrs

    def peer_view(self, rank: int, offset: int, count: int) -> torch.Tensor:
        raise NotImplementedError


def _as_int32(buf: SymmetricBuffer) -> SymmetricBuffer:
    return buf if buf.tensor.dtype == torch.int32 else _Int32View(buf)


def forget(ctx: FusedNormContext) -> None:
    """Drop this ctx's state (its buffers stay with whoever allocated them): call it when the
    ctx's group is closed, so a later ctx reusing the id starts afresh."""
    _STATES.pop(id(ctx), None)


def error_record(ctx: FusedNormContext) -> torch.Tensor:
    """This rank's debug-timeout record (see `check_timeout`)."""
    return _fused_for(ctx).err


def reserve(ctx: FusedNormContext, rows: int, hidden: int, dtype: torch.dtype,
            stage: int | None = None) -> FusedNormState:
    """Make sure a call of [rows, hidden] fits (collective when it allocates: every rank calls it
    with the same shape, outside graph capture) and return this rank's state for `dtype`; where
    the call will take the unfused fallback (`stage`, or the cost model's choice), its symmetric
    buffer too, so that a graph captured after this runs torch's two-shot all-reduce."""
    f = _fused_for(ctx)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if (stage if stage is not None else stage_choice(rows, hidden, ctx.world_size, itemsize)) == 0:
        _two_shot_buffer(ctx, rows * hidden, dtype)
    need = REGIONS * max(rows * hidden, 1) * itemsize
    have = f.buf.tensor.numel() * f.buf.tensor.element_size() if f.buf is not None else 0
    if have < need + REGIONS * 16:
        f.buf = ctx.symmetric(need + REGIONS * 16)
        f.states.clear()
    state = f.states.get(dtype)
    if state is None:
        assert f.buf is not None
        state = f.states[dtype] = _rank_state(f.buf, f.sig, f.ll, f.epoch, f.err, ctx.rank,
                                              ctx.world_size, f.grid, dtype)
    return state


def fused_add_rms_norm(ctx: FusedNormContext, x: torch.Tensor, residual: torch.Tensor,
                       weight: torch.Tensor, eps: float = 1e-6, *, stage: int | None = None,
                       out: torch.Tensor | None = None, res_out: torch.Tensor | None = None,
                       ordering: Ordering = SAFE, spin_limit: int = 0,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, new_residual) of all_reduce(x) + residual on this rank's current stream; every
    rank of ctx's group calls it with the same shape. `stage` None: the cost model's choice."""
    check_args(x, residual, weight, eps)
    if stage not in (None, 0, 1, 2, LL_STAGE):
        raise HiercollError(f"fused_add_rms_norm: stage {stage!r} must be 1, 2, {LL_STAGE} (LL), "
                            "0 (unfused) or None (the cost model's choice)")
    x, residual = x.contiguous(), residual.contiguous()
    rows, hidden = x.shape
    if stage == LL_STAGE:
        check_ll(rows, hidden, x.element_size())
    stages = stage if stage is not None else stage_choice(rows, hidden, ctx.world_size,
                                                          x.element_size())
    if ctx.world_size == 1:
        stages = 1
    if stages == 0:
        return unfused(ctx, x, residual, weight, eps, out, res_out)
    out = torch.empty_like(x) if out is None else out
    res_out = torch.empty_like(x) if res_out is None else res_out
    state = reserve(ctx, rows, hidden, x.dtype, stages)
    launch(state, x, residual, weight.to(x.dtype).contiguous(), out, res_out, eps, stages,
           spin_limit=spin_limit, ordering=ordering)
    return out, res_out


def stage_choice(rows: int, hidden: int, world: int, itemsize: int,
                 costs: FusedNormCosts | None = None) -> int:
    """The cost model's path for one call (`sim.fused_norm_cost.choose_stage`), the LL form
    among them where it can run the call (the kernels' rule)."""
    return choose_stage(rows, hidden, world, itemsize, costs,
                        ll=ll_applies(rows, hidden, itemsize))


def check_ll(rows: int, hidden: int, itemsize: int) -> None:
    """One line where the LL form cannot run a call (`fused_norm_abi.ll_applies`)."""
    if not ll_applies(rows, hidden, itemsize):
        raise HiercollError(f"fused_add_rms_norm: stage {LL_STAGE} (LL) runs bf16/fp16 with an "
                            f"even hidden and at most {ll_max_rows(hidden)} rows of {hidden}; "
                            f"got [{rows}, {hidden}] of {8 * itemsize}-bit elements: use stage 1")


def unfused(ctx: FusedNormContext, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
            eps: float, out: torch.Tensor | None = None, res_out: torch.Tensor | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The fallback where fusion cannot win (the cost model's stage 0, fitted on the same runs
    that measured the fused stages): the all-reduce of a copy of x, then torch's add and RMSNorm,
    as a user without hiercoll would write it (the sum rounded to x's dtype, the new residual to
    its dtype, like the kernel). The all-reduce is torch's symmetric-memory two-shot where it
    takes the call, up to TWO_SHOT_MAX_BYTES (x copied into a symmetric buffer of this shape;
    4 x H200, M = 512-2048 of hidden 2880: 33.3-94.3 us against 41.3-99.5 through NCCL,
    bench/results/gpu/fused_norm_multi/fallback-w4), else NCCL's. `out` given: one more copy (rms_norm has no out=)."""
    import torch.distributed as dist
    res_out = torch.empty_like(x) if res_out is None else res_out
    buf = _two_shot_buffer(ctx, x.numel(), x.dtype)
    if buf is None:
        res_out.copy_(x)
        dist.all_reduce(res_out, group=ctx.group)
        res_out.add_(residual)
    else:
        buf.view_as(x).copy_(x)
        torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", process_group(ctx.group).group_name)
        torch.add(buf.view_as(x), residual, out=res_out)
    normed = torch.nn.functional.rms_norm(res_out, (x.shape[1],), weight.to(x.dtype), eps)
    if out is None:
        return normed, res_out
    out.copy_(normed)
    return out, res_out


# The fallback's all-reduce is torch's two-shot up to this many bytes of x, NCCL's above. 4 x
# H200 (bench/results/gpu/fused_norm_multi/fallback-w4, graph, + add + norm): two-shot ahead at
# 1.5-16 MiB (M = 512-2048: 31.9-117.7 us against NCCL's 41.3-126.2), even at 32 MiB (224.0 /
# 220.6), behind at 128 MiB (597.3 / 566.9), before the copy into its buffer.
TWO_SHOT_MAX_BYTES = 16 << 20


def _two_shot_buffer(ctx: FusedNormContext, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
    """This ctx's symmetric buffer of `numel` elements for torch's two-shot all-reduce (made on
    first use: collective, every rank takes the fallback for the same shape), or None where
    torch's kernel does not take the call or a buffer cannot be made now (inside a graph
    capture: the NCCL path then)."""
    f = _fused_for(ctx)
    buf = f.two_shot.get((numel, dtype))
    if buf is not None:          # a call's fallback after its first: one dict lookup
        return buf
    if ctx.device.type != "cuda" or not hasattr(torch.ops, "symm_mem"):
        return None
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if (nbytes > TWO_SHOT_MAX_BYTES or not torch_symm_fits(nbytes, dtype, ctx.world_size)
            or torch.cuda.is_current_stream_capturing()):
        return None
    buf = f.two_shot[(numel, dtype)] = allocate(numel, dtype, ctx.device, ctx.group).tensor
    return buf


def check_timeout(err: torch.Tensor, rank: int) -> None:
    """Raise (one line) if a debug-mode wait gave up (synchronises)."""
    rec = err.tolist()
    if rec[0]:
        raise HiercollError(f"fused_add_rms_norm: rank {rank} CTA {rec[1]} timed out in phase "
                            f"{rec[2]} waiting for rank {rec[3]} (slot at {rec[4]}, needed "
                            f"{rec[5]}); a peer did not call, or called with another shape")


class OneGpuFusedNorm:
    """Every rank on one GPU, in one process: rank r's symmetric buffer is slab r of one
    allocation; `run` enqueues each rank's call on its own stream, all before anything waits."""

    def __init__(self, world: int, rows: int, hidden: int, dtype: torch.dtype,
                 device: torch.device, grid: int = ONE_GPU_GRID) -> None:
        if world < 1 or world * grid > 8 * 132:
            raise HiercollError(f"one-GPU fused norm: world {world} x grid {grid} CTAs must fit "
                                "on the GPU at once")
        self.world, self.device, self.dtype, self.grid = world, device, dtype, grid
        stride = -(-max(rows * hidden, 1) // 128) * 128
        data = slabs(world, REGIONS * stride, dtype, device)
        sigs = slabs(world, num_slots(grid, world), torch.int32, device)
        lls = slabs(world, ll_area_words(world), torch.int64, device)
        self.states = [self._state(data[r], sigs[r], lls[r], r, stride) for r in range(world)]
        self.streams = [torch.cuda.Stream(device=device) for _ in range(world)] \
            if device.type == "cuda" else []
        self.rows, self.hidden = rows, hidden

    def _state(self, data: Slab, sig: Slab, ll: Slab, rank: int, stride: int) -> FusedNormState:
        dev = self.device
        size = data.whole.element_size()
        return FusedNormState(
            buf=data.tensor, buf_deltas=torch.tensor(deltas(data, rank, size), dtype=torch.int64,
                                                     device=dev),
            sig=sig.tensor, sig_deltas=torch.tensor(deltas(sig, rank, 4), dtype=torch.int64,
                                                    device=dev),
            epoch=torch.zeros(self.grid, dtype=torch.int32, device=dev),
            err=torch.zeros(ERR_WORDS, dtype=torch.int64, device=dev), rank=rank,
            world=self.world, grid=self.grid, stride=stride, ll=ll.tensor,
            ll_deltas=torch.tensor(deltas(ll, rank, 8), dtype=torch.int64, device=dev))

    def stage_for(self, rows: int) -> int:
        """The one-GPU fit's choice (never the unfused fallback: no process group here)."""
        return stage_choice(rows, self.hidden, self.world,
                            torch.empty((), dtype=self.dtype).element_size(), costs=CALIBRATED)

    def run(self, xs: list[torch.Tensor], residuals: list[torch.Tensor], weight: torch.Tensor,
            eps: float, outs: list[torch.Tensor], res_outs: list[torch.Tensor], stages: int,
            ordering: Ordering = SAFE, spin_limit: int = 0,
            events: list[tuple[Any, Any]] | None = None) -> None:
        """One call of every rank, forked from and joined into the current stream; `events`
        (one (start, end) pair of CUDA events per rank) time each rank's launch."""
        caller = torch.cuda.current_stream()
        for r, state in enumerate(self.states):
            s = self.streams[r]
            s.wait_stream(caller)
            with torch.cuda.stream(s):
                if events is not None:
                    events[r][0].record(s)
                launch(state, xs[r], residuals[r], weight, outs[r], res_outs[r], eps, stages,
                       spin_limit=spin_limit, ordering=ordering)
                if events is not None:
                    events[r][1].record(s)
        for s in self.streams:
            caller.wait_stream(s)

    def run_parts(self, xs: list[torch.Tensor], residuals: list[torch.Tensor],
                  weight: torch.Tensor, eps: float, outs: list[torch.Tensor],
                  res_outs: list[torch.Tensor], stages: int) -> None:
        """Sequentially, part by part (Triton's CPU interpreter: ranks cannot run side by side,
        so every rank's signals are set before any rank waits)."""
        for part in range(parts(stages)):
            for r, state in enumerate(self.states):
                launch(state, xs[r], residuals[r], weight, outs[r], res_outs[r], eps, stages,
                       parts=(part, part))

    def capture(self, xs: list[torch.Tensor], residuals: list[torch.Tensor],
                weight: torch.Tensor, eps: float, outs: list[torch.Tensor],
                res_outs: list[torch.Tensor], stages: int, calls: int = 1,
                spin_limit: int = 0) -> list[torch.cuda.CUDAGraph]:
        """One CUDA graph per rank of `calls` back-to-back calls (after one eager warm-up call,
        which compiles the kernel); `replay` runs them side by side."""
        self.run(xs, residuals, weight, eps, outs, res_outs, stages, spin_limit=spin_limit)
        torch.cuda.synchronize()
        graphs = []
        for r, state in enumerate(self.states):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=self.streams[r]):
                for _ in range(calls):
                    launch(state, xs[r], residuals[r], weight, outs[r], res_outs[r], eps, stages,
                           spin_limit=spin_limit)
            graphs.append(g)
        torch.cuda.synchronize()
        return graphs

    def replay(self, graphs: list[torch.cuda.CUDAGraph],
               events: list[tuple[Any, Any]] | None = None) -> None:
        caller = torch.cuda.current_stream()
        for r, (g, s) in enumerate(zip(graphs, self.streams, strict=True)):
            s.wait_stream(caller)
            with torch.cuda.stream(s):
                if events is not None:
                    events[r][0].record(s)
                g.replay()
                if events is not None:
                    events[r][1].record(s)
        for s in self.streams:
            caller.wait_stream(s)

    def check_timeouts(self) -> None:
        for state in self.states:
            check_timeout(state.err, state.rank)
