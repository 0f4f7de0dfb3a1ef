"""Per-call time of a captured graph of `calls` calls, as the GPU probes measure it: CUDA events
around each replay, the replay's time over its calls (nccl-tests' -G way), every replay's."""

from __future__ import annotations

from collections.abc import Callable

import torch


def per_call_us(replay: Callable[[], None], reps: int, calls: int,
                before: Callable[[], None] | None = None) -> list[float]:
    """`reps` replays' times per call, in run order; `before` runs ahead of each replay
    (a barrier lines the ranks up)."""
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return times
