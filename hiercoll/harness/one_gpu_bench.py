"""Timing of one-GPU runs (every rank in this process on one GPU, `one_gpu.OneGpuCluster`).

Not a stand-in for a multi-GPU number: the ranks share one GPU's SMs, HBM and copy engines, and
one host thread launches for all of them. It is what the simulator's one-GPU topology predicts,
which makes it the first place where predictions meet real kernels.
"""

from __future__ import annotations

import torch

from hiercoll.executor.cuda.one_gpu import OneGpuCluster
from hiercoll.executor.interface import Mode
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.harness.bench import Timing, event_times_us, summarise_us
from hiercoll.harness.inputs import device_inputs

GRAPH_BYTES = 64 << 20   # a graph holds calls up to about this many bytes in all
# Eager calls up to this size are host-bound (one thread launches every rank's work) and the
# host's speed wanders over tens of milliseconds: at least EAGER_MIN_ITERS calls per point
EAGER_HOST_BOUND_BYTES, EAGER_MIN_ITERS = 4 << 20, 200


def time_one_gpu(cluster: OneGpuCluster, mode: Mode, iters: int, warmup: int = 3,
                 calls_per_graph: int | None = None) -> Timing:
    """Per-call percentiles: eager, CUDA events around each host-launched call of every rank;
    graph, each rank's graph holds `calls_per_graph` calls and a replay's time is divided by it
    (so the host's launch cost stays out, as in a captured training step). Default: 20 calls,
    fewer from 4 MiB up (one at 64 MiB and more: a replay's launch is then well under 1 % of
    it, and 20 calls of 256 MiB would only spend device time)."""
    spec, dev = cluster.schedule.spec, cluster.device
    if calls_per_graph is None:
        calls_per_graph = max(1, min(20, GRAPH_BYTES // max(spec.total_bytes, 1)))
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    ins = [device_inputs(spec, r, dev, gen) for r in range(spec.world_size)]
    outs = [torch.zeros(spec.output_count(r), dtype=torch_dtype(spec.dtype), device=dev)
            for r in range(spec.world_size)]
    calls = calls_per_graph if mode == Mode.GRAPH else 1
    if mode == Mode.EAGER and spec.total_bytes <= EAGER_HOST_BOUND_BYTES:
        iters = max(iters, EAGER_MIN_ITERS)
    if mode == Mode.GRAPH:
        graphs = cluster.capture(ins, outs, calls)
        call = graphs.replay
    else:
        def call() -> None:
            cluster.run(ins, outs)
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = event_times_us(call, iters)
    cluster.check_timeouts()
    return summarise_us([t / calls for t in times])
