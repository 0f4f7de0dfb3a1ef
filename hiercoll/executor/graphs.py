"""CUDA-graph replay of any backend's `run` (the cuda backend and the nccl pseudo-backend alike).

The backend's `run` must be capturable: no host synchronisation and no host decisions that
depend on device data. Static input/output tensors live here; callers copy fresh data into
`input` before `replay()` and read `output` after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hiercoll.executor.interface import Backend, Prepared


@dataclass
class CapturedRun:
    graph: torch.cuda.CUDAGraph
    input: torch.Tensor     # (input_count,) spec dtype, on the device
    output: torch.Tensor    # (output_count,) spec dtype, on the device
    calls: int              # back-to-back runs inside the graph

    def replay(self) -> None:
        self.graph.replay()


def capture(backend: Backend, prepared: Prepared, input: torch.Tensor, output: torch.Tensor,
            calls: int = 1, warmup: int = 2) -> CapturedRun:
    """Warm up on a side stream (NCCL and lazy allocations need it), then capture `calls` runs.

    Collective: every rank must capture the same thing at the same time.
    """
    graph = capture_calls(lambda: backend.run(prepared, input, output), calls, warmup)
    return CapturedRun(graph, input, output, calls)


def capture_calls(call: Callable[[], object], calls: int = 1, warmup: int = 2) -> torch.cuda.CUDAGraph:
    """A graph of `calls` back-to-back `call()`s, after `warmup` calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    torch.cuda.synchronize()
    return graph
