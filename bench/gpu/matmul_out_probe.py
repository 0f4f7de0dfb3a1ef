"""Does writing the row-parallel matmul into a given buffer (`torch.matmul(a, w.t(), out=buf)`,
how bench/tp_model.py's comm.empty path fills its communicator tensor) cost more than
`F.linear`? One GPU, the TP 2/4 shapes of that model (128 tokens, hidden 4096, K = the rank's
slice), a CUDA graph of 20 calls, p50 us per call over 20 replays.

    python3 bench/gpu/matmul_out_probe.py
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def per_call_us(fn: Callable[[], object], calls: int = 20, reps: int = 20) -> float:
    """p50 us per call of a graph of `calls` calls (the harness's own capture and events)."""
    from hiercoll.executor.graphs import capture_calls
    from hiercoll.harness.bench import event_times_us
    graph = capture_calls(fn, calls, warmup=10)
    graph.replay()
    torch.cuda.synchronize()
    return round(statistics.median(event_times_us(graph.replay, reps)) / calls, 2)


def main() -> None:
    torch.manual_seed(0)
    for k in (2048, 7168, 1024, 3584):
        a = torch.randn(128, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, k, device="cuda", dtype=torch.bfloat16)
        buf = torch.empty(128, 4096, device="cuda", dtype=torch.bfloat16)
        print(k, {"linear": per_call_us(lambda a=a, w=w: F.linear(a, w)),
                  "matmul_out": per_call_us(lambda a=a, w=w, b=buf: torch.matmul(a, w.t(), out=b)),
                  "mm_out": per_call_us(lambda a=a, w=w, b=buf: torch.mm(a, w.t(), out=b))},
              flush=True)


if __name__ == "__main__":
    main()
