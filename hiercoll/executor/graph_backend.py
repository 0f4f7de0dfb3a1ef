"""Graph mode as a backend wrapper: `run` copies into static tensors and replays a CUDA graph.

The graph is captured on the first `run` (a collective step: all ranks call `run` together), so
stress and `hiercoll run --mode graph` use the same loop as eager mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hiercoll.executor.graphs import CapturedRun, capture
from hiercoll.executor.interface import Backend, Mode, Prepared, RunResult
from hiercoll.executor.torch_dtypes import torch_dtype


@dataclass
class GraphBackend:
    inner: Backend
    captured: CapturedRun | None = None

    @property
    def name(self):
        return self.inner.name

    def prepare(self, schedule: Any, group: Any = None) -> Prepared:
        return self.inner.prepare(schedule, group)

    def run(self, prepared: Prepared, input: torch.Tensor, output: torch.Tensor) -> RunResult:
        if self.captured is None:
            spec, rank = prepared.schedule.spec, prepared.rank
            dt = torch_dtype(spec.dtype)
            static_in = torch.empty(spec.input_count(rank), dtype=dt, device=input.device)
            static_out = torch.empty(spec.output_count(rank), dtype=dt, device=input.device)
            static_in.copy_(input)
            static_out.copy_(output)
            self.captured = capture(self.inner, prepared, static_in, static_out)
        cap = self.captured
        cap.input.copy_(input)
        cap.output.copy_(output)
        cap.replay()
        output.copy_(cap.output)
        return RunResult(self.inner.name, prepared.rank, output, Mode.GRAPH)


def maybe_graph(backend: Backend, prepared: Prepared, mode: str,
                device: torch.device) -> tuple[Backend, Prepared]:
    if Mode(mode) == Mode.EAGER:
        return backend, prepared
    if device.type != "cuda":
        from hiercoll.errors import HiercollError
        raise HiercollError("--mode graph: CUDA graphs need a GPU backend (cuda or nccl)")
    return GraphBackend(backend), prepared  # type: ignore[return-value]
