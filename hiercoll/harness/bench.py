"""One benchmark harness, long-form rows (one per collective x algorithm x mode x size).

Times are per call, p50/p90/p99 over iterations, then the max over ranks (the slowest rank
finishes the collective). Eager: CUDA events around each batch of `eager_calls` back-to-back
calls, its time divided by them (nccl-tests likewise averages over its iterations): events
around every call would put two event records (~5 us of host each on the H200 machines,
results/gpu/host_launch_gpu.md) into every host-bound call. Graph: as nccl-tests' CUDA-graph
mode, one graph holds `graph_calls` back-to-back calls and a replay's time is divided by them; a
one-call graph would time the host's replay cost, which a model captured whole never pays per
collective. On CPU (gloo) wall-clock time per call. Bandwidths follow
nccl-tests (CollectiveSpec).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hiercoll.collectives import CollectiveSpec
from hiercoll.executor.graphs import capture_calls
from hiercoll.executor.interface import Backend, Mode, Prepared
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.gcpause import without_cyclic_gc
from hiercoll.harness.defaults import EAGER_CALLS, GRAPH_CALLS
from hiercoll.harness.inputs import device_inputs
from hiercoll.schedule import Schedule


@dataclass(frozen=True)
class Timing:
    p50_us: float
    p90_us: float
    p99_us: float
    iters: int
    graph_calls: int = 0    # calls per graph replay (graph mode), 0 for eager
    eager_calls: int = 0    # calls per timed batch (eager mode), 0 for graph


@dataclass(frozen=True, kw_only=True)
class BenchRow:
    """One measured point, with the plan's recipe (algorithm, params, spec, topology
    fingerprint), so `hiercoll calibrate/compare` can re-plan and simulate exactly what ran."""

    collective: str
    algorithm: str
    backend: str
    mode: str
    world_size: int
    topology: str
    dtype: str
    nbytes: int
    p50_us: float
    p90_us: float
    p99_us: float
    algbw_gbps: float
    busbw_gbps: float
    iters: int
    params: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    reduce_op: str = "sum"
    topology_fingerprint: str = ""
    predicted_us: float | None = None
    zero_copy: bool = False      # cuda: the call worked on the symmetric buffers (no copy-in/out)
    one_gpu: bool = False        # every rank in one process on one GPU (bench --one-gpu)
    graph_calls: int = 0         # graph mode: back-to-back calls per replay (0: eager)
    # eager mode: back-to-back calls per timed batch (0: graph mode, or a row from before
    # 2026-11-29, whose eager calls were each timed alone, two event records inside each)
    eager_calls: int = 0
    peer: bool = False           # not a hiercoll plan: a peer's call (harness.peers), same timer
    options: dict[str, Any] = field(default_factory=dict)   # cuda lowering knobs of the run

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def make_row(schedule: Schedule, backend: str, mode: Mode, topology: str, timing: Timing, *,
             predicted_us: float | None = None, zero_copy: bool = False,
             one_gpu: bool = False, options: dict[str, Any] | None = None) -> BenchRow:
    meta = schedule.meta
    return BenchRow(**_timed(schedule.spec, timing), algorithm=meta.algorithm, backend=backend,
                    mode=mode.value, topology=topology,
                    params=plan_params(meta.params), spec=meta.spec.model_dump(mode="json",
                                                                        exclude_none=True),
                    topology_fingerprint=meta.topology_fingerprint,
                    predicted_us=predicted_us, zero_copy=zero_copy, one_gpu=one_gpu,
                    options=dict(options or {}))


def peer_row(spec: CollectiveSpec, name: str, mode: Mode, topology: str,
             timing: Timing) -> BenchRow:
    """A peer's point (harness.peers): no plan behind it, so no recipe to re-plan; `nccl`
    keeps the library's algorithm name, which calibrate reads as the library call."""
    return BenchRow(**_timed(spec, timing), algorithm=name, backend="peer", mode=mode.value,
                    topology=topology, peer=True, zero_copy=True)


def _timed(spec: CollectiveSpec, timing: Timing) -> dict[str, Any]:
    """The fields every row has: what was timed and its times, nccl-tests' bandwidths (full
    precision: the files round when printed)."""
    algbw, busbw = spec.bandwidths_gbps(timing.p50_us)
    return {"collective": spec.kind.value, "world_size": spec.world_size,
            "dtype": spec.dtype.value, "nbytes": spec.total_bytes, "reduce_op": spec.reduce_op.value,
            "p50_us": timing.p50_us, "p90_us": timing.p90_us, "p99_us": timing.p99_us,
            "algbw_gbps": algbw, "busbw_gbps": busbw, "iters": timing.iters,
            "graph_calls": timing.graph_calls, "eager_calls": timing.eager_calls}


def plan_params(params: dict[str, Any]) -> dict[str, Any]:
    """A plan's parameters as a row records them: unset ones (None: the algorithm's default,
    e.g. hier's `nics`) left out, so calibrate/compare re-plan with the same default."""
    return {k: v for k, v in params.items() if v is not None}


def summarise_us(times_us: list[float]) -> Timing:
    """p50/p90/p99 of per-call times (one process: no reduction over ranks)."""
    p = np.percentile(np.asarray(times_us), [50, 90, 99])
    return Timing(float(p[0]), float(p[1]), float(p[2]), len(times_us))


def iterations_for(nbytes: int, budget_bytes: float = 8e9, lo: int = 5, hi: int = 200) -> int:
    """Fewer iterations for big sizes so a sweep fits a time budget."""
    return int(min(hi, max(lo, budget_bytes // max(nbytes, 1))))


def time_run(backend: Backend, prepared: Prepared, device: torch.device, mode: Mode,
             iters: int, warmup: int = 3, group: Any = None, zero_copy: bool = False,
             graph_calls: int = GRAPH_CALLS, eager_calls: int = EAGER_CALLS) -> Timing:
    """Collective: every rank must call it with the same arguments. `zero_copy` (cuda backend):
    pass the prepared symmetric input/output views, so no copy-in/copy-out is timed."""
    spec, rank = prepared.schedule.spec, prepared.rank
    gen = torch.Generator(device=device)
    gen.manual_seed(1234 + rank)
    inp = device_inputs(spec, rank, device, gen)
    out = torch.zeros(spec.output_count(rank), dtype=torch_dtype(spec.dtype), device=device)
    if zero_copy:
        sym_in, sym_out = prepared.input_view, prepared.output_view  # type: ignore[attr-defined]
        sym_in.copy_(inp)
        inp, out = sym_in, sym_out
    if device.type != "cuda":
        times = []
        for i in range(warmup + iters):
            dist.barrier(group)
            t0 = time.perf_counter()
            backend.run(prepared, inp, out)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e6)
        return _summarise(times, device, group)
    return time_call(lambda: backend.run(prepared, inp, out), device, mode, iters, warmup,
                     group, graph_calls, eager_calls)


def time_call(call: Callable[[], object], device: torch.device, mode: Mode, iters: int,
              warmup: int = 3, group: Any = None, graph_calls: int = GRAPH_CALLS,
              eager_calls: int = EAGER_CALLS) -> Timing:
    """Per-call times of a capturable CUDA `call` (a plan's run or a peer's), collective over
    `group`: `iters` batches of `eager_calls` back-to-back eager calls, or `iters` replays of one
    graph of `graph_calls` calls."""
    if mode == Mode.GRAPH:
        graph = capture_calls(call, graph_calls, warmup)
        graph.replay()
        run: Callable[[], object] = graph.replay
        per = graph_calls
    else:
        for _ in range(warmup):
            call()

        def run() -> None:
            for _ in range(eager_calls):
                call()
        per = eager_calls
    torch.cuda.synchronize()
    dist.barrier(group)
    times = [t / per for t in event_times_us(run, iters)]
    timing = _summarise(times, device, group)
    captured = mode == Mode.GRAPH
    return replace(timing, graph_calls=graph_calls if captured else 0,
                   eager_calls=0 if captured else eager_calls)


def event_times_us(call: Callable[[], object], iters: int) -> list[float]:
    """Microseconds of each of `iters` back-to-back calls, from CUDA events around each (the
    caller has warmed up and synchronised). Python's garbage collector is paused meanwhile: a
    collection inside a host-bound eager call is the harness's cost, not the plan's."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    with without_cyclic_gc():
        for i in range(iters):
            starts[i].record()
            call()
            ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)]


def _summarise(times_us: list[float], device: torch.device, group: Any) -> Timing:
    """The slowest rank's percentiles (the collective ends when its last rank does)."""
    local = summarise_us(times_us)
    t = torch.tensor([local.p50_us, local.p90_us, local.p99_us], dtype=torch.float64,
                     device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    v = t.tolist()
    return Timing(v[0], v[1], v[2], len(times_us))
