"""Stress of the fused all-reduce + residual add + RMSNorm against the unfused reference (the
regression of AITER PR 2890: fresh random inputs every iteration, the worst max-abs error and the
first bad iteration per shape, eager and graph).

Three paths, one check:
- one GPU (`stress_one_gpu`): every rank in this process (`OneGpuFusedNorm`);
- one process per rank on GPUs (`stress_group`, cuda): the fused kernel over symmetric memory;
- one process per rank on CPU (`stress_group`, gloo): the unfused fallback, so CI runs the
  harness (inputs, reference, reporting) end to end.
The reference (passed in: `hiercoll.torch.reference.unfused_add_rms_norm`): all-reduce in fp32
(ranks summed in order) -> the dtype -> residual add -> RMSNorm, computed from every rank's x.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hiercoll.executor.cuda.fused_norm import OneGpuFusedNorm
from hiercoll.kernels.fused_norm_abi import SAFE, Ordering

SHAPES = (1, 2, 4, 8, 16, 64, 128, 512, 1024, 1319, 2048, 4096, 16384)
HIDDEN = (2880, 4096)
BOUND = 0.5          # max-abs error allowed (bf16 outputs of O(1) values, as the seed's test)
EPS = 1e-6


# The unfused reference's signature: (every rank's x, or their sum in fp32; residual; weight;
# eps) -> (normed, new_residual). The one definition is hiercoll.torch.reference
# .unfused_add_rms_norm, which sits above this package: the callers (the CLI, the bench, the
# tests) pass it in.
Reference = Callable[[Any, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


def unfused_fallback(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                     reference: Reference, group: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What runs where the fused kernel cannot (CPU/gloo): torch.distributed all-reduce in fp32,
    then the reference's add and RMSNorm."""
    import torch.distributed as dist
    acc = x.float()
    dist.all_reduce(acc, group=group)
    return reference(acc, residual, weight, eps)


@dataclass
class FusedStressReport:
    rows: int
    hidden: int
    world: int
    stage: int          # 0: the unfused fallback (gloo)
    mode: str
    path: str           # one-gpu | cuda | gloo
    iterations: int
    max_abs_error: float
    bound: float
    first_bad_iteration: int | None
    bad_rank: int | None
    ranks_identical: bool   # every rank's outputs bit-identical in every iteration
    seconds: float

    @property
    def ok(self) -> bool:
        return self.first_bad_iteration is None and self.ranks_identical

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok, "dtype": "bf16"}


def _draw(gen: torch.Generator, world: int, rows: int, hidden: int, dev: torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh inputs: x of every rank, the residual, the weight (O(1) values, as in a model)."""
    xs = torch.randn(world, rows, hidden, generator=gen, device=dev).to(dtype)
    res = torch.randn(rows, hidden, generator=gen, device=dev).to(dtype)
    w = (torch.rand(hidden, generator=gen, device=dev) + 0.5).to(dtype)
    return xs, res, w


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.float() - b.float()).abs()
    return float("inf") if bool(torch.isnan(d).any()) else float(d.max()) if d.numel() else 0.0


def stress_one_gpu(reference: Reference, world: int, rows: int, hidden: int, iters: int,
                   mode: str = "eager",
                   seed: int = 0, stage: int | None = None, dtype: torch.dtype = torch.bfloat16,
                   ordering: Ordering = SAFE, spin_limit: int = 0,
                   max_seconds: float | None = None, stop_on_error: bool = True,
                   device: torch.device | None = None) -> FusedStressReport:
    dev = device or torch.device("cuda", torch.cuda.current_device())
    cl = OneGpuFusedNorm(world, rows, hidden, dtype, dev)
    stages = stage or cl.stage_for(rows)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    xs = torch.empty(world, rows, hidden, dtype=dtype, device=dev)
    res = torch.empty(rows, hidden, dtype=dtype, device=dev)
    w = torch.empty(hidden, dtype=dtype, device=dev)
    outs = [torch.empty(rows, hidden, dtype=dtype, device=dev) for _ in range(world)]
    routs = [torch.empty(rows, hidden, dtype=dtype, device=dev) for _ in range(world)]
    ress = [res] * world
    graphs = None
    if mode == "graph":
        x0, r0, w0 = _draw(gen, world, rows, hidden, dev, dtype)
        xs.copy_(x0)
        res.copy_(r0)
        w.copy_(w0)
        graphs = cl.capture(list(xs), ress, w, EPS, outs, routs, stages, spin_limit=spin_limit)
    worst, first_bad, bad_rank, identical, done = 0.0, None, None, True, 0
    t0 = time.perf_counter()
    for it in range(iters):
        if max_seconds is not None and it and time.perf_counter() - t0 > max_seconds:
            break
        x1, r1, w1 = _draw(gen, world, rows, hidden, dev, dtype)
        xs.copy_(x1)
        res.copy_(r1)
        w.copy_(w1)
        for o in outs + routs:
            o.fill_(float("nan"))
        if graphs is not None:
            cl.replay(graphs)
        else:
            cl.run(list(xs), ress, w, EPS, outs, routs, stages, ordering=ordering,
                   spin_limit=spin_limit)
        if spin_limit:
            cl.check_timeouts()
        want_n, want_r = reference(list(xs), res, w, EPS)
        done = it + 1
        for r in range(world):
            e = max(_err(outs[r], want_n), _err(routs[r], want_r))
            worst = max(worst, e)
            if not e <= BOUND and first_bad is None:
                first_bad, bad_rank = it, r
            if r and not (torch.equal(outs[r], outs[0]) and torch.equal(routs[r], routs[0])):
                identical = False
        if first_bad is not None and stop_on_error:
            break
    torch.cuda.synchronize()
    return FusedStressReport(rows, hidden, world, stages, mode, "one-gpu", done, worst, BOUND,
                             first_bad, bad_rank, identical, time.perf_counter() - t0)


# what NCCL's collectives move (int16, uint16, bool are refused: "data type is not supported
# for NCCL process group: Short", the first multi-GPU run of this stress)
NCCL_DTYPES = (torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
               torch.float32, torch.float64)


def comparison_bits(*tensors: torch.Tensor) -> torch.Tensor:
    """The tensors' bytes as one uint8 tensor: what ranks broadcast to compare bits (NaN equals
    NaN, -0.0 differs from +0.0), in a dtype every process group moves."""
    return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])


def stress_group(reference: Reference, rows: int, hidden: int, iters: int, mode: str = "eager",
                 seed: int = 0,
                 stage: int | None = None, dtype: torch.dtype = torch.bfloat16,
                 spin_limit: int = 0, group: Any = None,
                 ordering: Ordering = SAFE) -> FusedStressReport:
    """One rank of a process group (torchrun): cuda runs the fused kernel, CPU the unfused
    fallback. Every rank draws every rank's inputs from the same seed, so the reference needs no
    communication; the verdict (worst error, first bad iteration) is agreed over the group."""
    import torch.distributed as dist

    from hiercoll.executor.cuda.fused_norm import (
        GroupContext,
        check_timeout,
        error_record,
        fused_add_rms_norm,
        stage_choice,
    )
    from hiercoll.executor.cuda.fused_norm import reserve as reserve_buf
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    cuda = torch.cuda.is_available() and dist.get_backend(group) == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    ctx = GroupContext(rank, world, group, dev) if cuda else None
    x = torch.empty(rows, hidden, dtype=dtype, device=dev)
    res = torch.empty(rows, hidden, dtype=dtype, device=dev)
    w = torch.empty(hidden, dtype=dtype, device=dev)
    out = torch.empty_like(x)
    rout = torch.empty_like(x)
    stages = 0
    graph = None
    if ctx is not None:
        stages = stage if stage is not None else stage_choice(rows, hidden, world,
                                                              x.element_size())
        reserve_buf(ctx, rows, hidden, dtype, stages)
        # one untimed call without a spin limit: a rank still in Triton's JIT must not make its
        # peers' debug waits give up
        fused_add_rms_norm(ctx, x.normal_(), res.normal_(), w.fill_(1), EPS, stage=stages,
                           out=out, res_out=rout)
        torch.cuda.synchronize()
        dist.barrier(group=group)
        if mode == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fused_add_rms_norm(ctx, x, res, w, EPS, stage=stages, out=out, res_out=rout,
                                   spin_limit=spin_limit, ordering=ordering)
    worst, first_bad, identical, done = 0.0, None, True, 0
    t0 = time.perf_counter()
    for it in range(iters):
        xs, r1, w1 = _draw(gen, world, rows, hidden, dev, dtype)
        x.copy_(xs[rank])
        res.copy_(r1)
        w.copy_(w1)
        out.fill_(float("nan"))
        rout.fill_(float("nan"))
        if ctx is None:
            n, r = unfused_fallback(x, res, w, EPS, reference, group)
            out.copy_(n)
            rout.copy_(r)
        elif graph is not None:
            graph.replay()
        else:
            fused_add_rms_norm(ctx, x, res, w, EPS, stage=stages, out=out, res_out=rout,
                               spin_limit=spin_limit, ordering=ordering)
        if ctx is not None and spin_limit:
            check_timeout(error_record(ctx), rank)
        want_n, want_r = reference(list(xs), res, w, EPS)
        e = max(_err(out, want_n), _err(rout, want_r))
        verdict = torch.tensor([e if e == e and e != float("inf") else 1e30,
                                0.0 if e <= BOUND else 1.0], dtype=torch.float64, device=dev)
        dist.all_reduce(verdict, op=dist.ReduceOp.MAX, group=group)
        if ctx is not None:     # rank-identical bits: rank 0's outputs against everyone's
            mine = comparison_bits(out, rout)
            ref0 = mine.clone()
            dist.broadcast(ref0, src=dist.get_global_rank(group, 0) if group else 0, group=group)
            same = torch.tensor([0.0 if torch.equal(mine, ref0) else 1.0], device=dev)
            dist.all_reduce(same, op=dist.ReduceOp.MAX, group=group)
            identical = identical and float(same) == 0.0
        worst = max(worst, float(verdict[0]))
        done = it + 1
        if float(verdict[1]) and first_bad is None:
            first_bad = it
            break
    return FusedStressReport(rows, hidden, world, stages, mode, "cuda" if cuda else "gloo", done,
                             worst, BOUND, first_bad, None, identical, time.perf_counter() - t0)

