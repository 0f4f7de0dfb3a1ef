"""A measured per-op timeline of one call (`hiercoll run --profile`): CUDA events around every
launch of every rank, lowered one op per launch, written with the plan's recipe so that
`hiercoll compare --timeline` can put the simulated timeline of the same plan beside it."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hiercoll.executor.cuda.backend import CudaBackend, CudaPrepared, LaunchTimer, enqueue
from hiercoll.executor.cuda.lowering import CudaOptions
from hiercoll.executor.cuda.one_gpu import OneGpuCluster
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.harness.inputs import device_inputs
from hiercoll.schedule import Schedule

WARMUP_CALLS = 3


def profiling_options(options: CudaOptions) -> CudaOptions:
    """What a profiled call is lowered with: one launch per op and no fusion (so a launch's
    events time one op), eager."""
    return dataclasses.replace(options, launch_per_op=True, fuse=False)


def _rows(timer: LaunchTimer, rank: int, reference: Any = None) -> list[dict[str, Any]]:
    return [{"rank": rank, "channel": ch, "launch": label,
             "ops": [o for o in label.split(",") if o[:1].isdigit()],
             "start_us": round(t0, 3), "end_us": round(t1, 3)}
            for label, ch, t0, t1 in timer.times_us(reference)]


def timeline_document(schedule: Schedule, topology: str, rows: list[dict[str, Any]],
                      setting: str) -> dict[str, Any]:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"kind": "hiercoll-timeline", "plan": schedule.meta.to_json(), "topology": topology,
            "setting": setting, "device": device, "mode": "eager", "launches": rows}


def profile_one_gpu(schedule: Schedule, options: CudaOptions, topology: str,
                    seed: int = 0) -> dict[str, Any]:
    """Every rank in this process on one GPU: warm-up calls, then one timed call."""
    cluster = OneGpuCluster(schedule.expand(), profiling_options(options))
    spec, dev = schedule.spec, cluster.device
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    ins = [device_inputs(spec, r, dev, gen) for r in range(spec.world_size)]
    outs = [torch.zeros(spec.output_count(r), dtype=torch_dtype(spec.dtype), device=dev)
            for r in range(spec.world_size)]
    for _ in range(WARMUP_CALLS):
        cluster.run(ins, outs)
    torch.cuda.synchronize()
    timers = [LaunchTimer() for _ in range(spec.world_size)]
    reference = torch.cuda.Event(enable_timing=True)
    reference.record()
    cluster.run(ins, outs, timers)
    cluster.check_timeouts()
    rows = [row for r, t in enumerate(timers) for row in _rows(t, r, reference)]
    return timeline_document(schedule, topology, rows, "one GPU: every rank in one process")


def profile_rank(backend: CudaBackend, prepared: CudaPrepared, device: torch.device,
                 seed: int = 0) -> list[dict[str, Any]]:
    """This rank's launches of one timed call (every rank calls it; times from this rank's call
    start: ranks start together after a barrier, so the ranks' clocks line up to within it)."""
    import torch.distributed as dist
    spec, rank = prepared.schedule.spec, prepared.rank
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + rank)
    inp = device_inputs(spec, rank, device, gen)
    out = torch.zeros(spec.output_count(rank), dtype=torch_dtype(spec.dtype), device=device)
    for _ in range(WARMUP_CALLS):
        backend.run(prepared, inp, out)
    torch.cuda.synchronize()
    dist.barrier()
    timer = LaunchTimer()
    enqueue(prepared, inp, out, backend.net_hook, timer)
    return _rows(timer, rank)
