"""Every rank of a schedule on one GPU, in one process: the cuda backend's real kernels, signal
protocol, copy-engine copies and CUDA-graph capture, with no process group.

Why: the kernels and the cross-rank signalling need a GPU to be tested for real (compilation per
dtype, memory ordering on the device, epochs under graph replay), and one GPU is what is often at
hand. Rank r's "symmetric allocation" is slab r of one device allocation, so peer addresses are
plain offsets, as symmetric memory makes them across GPUs; the row table, launches and streams are
the ones `CudaBackend` builds. Each rank has its own main stream and every rank's work is enqueued
before anything waits, so the spinning kernels of different ranks run side by side on the SMs.
Results are what a multi-GPU run computes; timings say nothing about NVLink.

CUDA_DEVICE_MAX_CONNECTIONS=32 must be set before CUDA starts (`hiercoll stress --one-gpu` and
the scripts do): with fewer hardware queues than streams, a spinning kernel can sit in front of
the kernel it waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from hiercoll.errors import HiercollError
from hiercoll.executor.cuda.backend import CudaPrepared, LaunchTimer, build_prepared, check_timeouts, enqueue
from hiercoll.executor.cuda.lowering import CudaOptions, InterTransport, lower
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.schedule import Schedule

ONE_GPU_CTAS = 4   # CTAs per launch: every rank's kernels must be resident on one GPU at once


@dataclass
class Slab:
    """Rank `rank`'s part of one allocation holding every rank's data (quacks like
    `symm.SymmetricTensor`: tensor, base_ptrs, peer_view)."""

    whole: torch.Tensor
    rank: int
    stride: int       # elements per rank

    @property
    def tensor(self) -> torch.Tensor:
        return self.whole[self.rank * self.stride:(self.rank + 1) * self.stride]

    @property
    def base_ptrs(self) -> list[int]:
        size = self.whole.element_size()
        world = self.whole.numel() // self.stride
        return [self.whole.data_ptr() + r * self.stride * size for r in range(world)]

    def peer_view(self, rank: int, offset: int, count: int) -> torch.Tensor:
        start = rank * self.stride + offset
        return self.whole[start:start + count]


def slabs(world: int, numel: int, dtype: torch.dtype, device: torch.device) -> list[Slab]:
    """One zeroed allocation cut into `world` slabs of at least `numel` elements, each starting on
    a 256-byte boundary (as symmetric allocations do)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    stride = -(-max(numel, 1) * itemsize // 256) * 256 // itemsize
    whole = torch.zeros(world * stride, dtype=dtype, device=device)
    return [Slab(whole, r, stride) for r in range(world)]


class OneGpuCluster:
    """All ranks of `schedule` on one GPU. `run` takes every rank's input and output."""

    def __init__(self, schedule: Schedule, options: CudaOptions | None = None,
                 device: torch.device | None = None) -> None:
        opts = options or CudaOptions()
        if opts.inter_transport != InterTransport.PEER:
            raise HiercollError("one-GPU runs: inter_transport must be 'peer' (NCCL send/recv "
                                "needs one process per GPU)")
        if opts.ctas is None:
            opts = replace(opts, ctas=ONE_GPU_CTAS)
        self.schedule = schedule
        self.options = opts
        self.device = device or torch.device("cuda", torch.cuda.current_device())
        w = schedule.world_size
        programs = [lower(schedule, r, opts) for r in range(w)]
        data = slabs(w, programs[0].layout.total, torch_dtype(schedule.spec.dtype), self.device)
        sigs = slabs(w, programs[0].num_slots, torch.int32, self.device)
        self.prepared: list[CudaPrepared] = [
            build_prepared(schedule, programs[r], data[r], sigs[r], w, opts, self.device)
            for r in range(w)]
        self.mains = [torch.cuda.Stream(device=self.device) for _ in range(w)]
        torch.cuda.synchronize()

    def run(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
            timers: list[LaunchTimer] | None = None) -> None:
        """Enqueue one call of every rank, forked from and joined into the current stream;
        `timers` (one per rank) record every launch (eager)."""
        caller = torch.cuda.current_stream()
        try:      # set_stream: a stream context per rank costs more host time
            for r, (prepared, main, inp, out) in enumerate(zip(self.prepared, self.mains, inputs,
                                                               outputs, strict=True)):
                main.wait_stream(caller)
                torch.cuda.set_stream(main)
                enqueue(prepared, inp, out, timer=None if timers is None else timers[r],
                        main=main)
        finally:
            torch.cuda.set_stream(caller)
        for main in self.mains:
            caller.wait_stream(main)

    def check_timeouts(self) -> None:
        """Raise, naming rank, op and producer, if a debug-mode wait gave up (synchronises)."""
        for prepared in self.prepared:
            check_timeouts(prepared)

    def capture(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                calls: int = 1) -> OneGpuGraphs:
        """One CUDA graph per rank (as each process of a multi-GPU run captures its own) holding
        `calls` back-to-back calls, after one eager warm-up call; `replay` launches them side by
        side. Timing many calls per replay keeps the host's launch cost out of the number."""
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.run(inputs, outputs)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graphs = []
        for prepared, inp, out in zip(self.prepared, inputs, outputs, strict=True):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    enqueue(prepared, inp, out)
            graphs.append(graph)
        torch.cuda.synchronize()
        return OneGpuGraphs(graphs, self.mains)


@dataclass
class OneGpuGraphs:
    graphs: list[torch.cuda.CUDAGraph]
    mains: list[torch.cuda.Stream]

    def replay(self) -> None:
        caller = torch.cuda.current_stream()
        for graph, main in zip(self.graphs, self.mains, strict=True):
            main.wait_stream(caller)
            with torch.cuda.stream(main):
                graph.replay()
        for main in self.mains:
            caller.wait_stream(main)
