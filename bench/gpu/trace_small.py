"""Where a small call's time goes *inside* the row kernel on real GPUs (one process per GPU):
in-kernel %globaltimer stamps (`HIERCOLL_KERNEL_TRACE=1`, executor/cuda/kernel_trace.py) of
every call of a 10-call graph, next to the per-call time of the same graph without tracing and
torch's one-shot kernel in the same process group. ncu cannot replay a kernel that waits on its
peers; these stamps can be taken where the waits are real.

Per rank and row, medians over calls: header loaded, waits satisfied, data moved, signals
issued (us from the kernel's start), the kernel's duration, and the gap from one call's end to
the next call's start (launch of the next graph node).

    HIERCOLL_KERNEL_TRACE=1 torchrun --nproc-per-node 4 bench/gpu/trace_small.py --out DIR
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.gpu.replay_timing import per_call_us  # noqa: E402
from bench.gpu.small_cases import cases, finish, sizes, start  # noqa: E402
from hiercoll.executor.cuda.kernel_trace import PHASES, read_traces  # noqa: E402
from hiercoll.executor.graphs import capture_calls  # noqa: E402
from hiercoll.harness.peers import peers_for  # noqa: E402

CALLS = 10
REPLAYS = 20


def _per_call_us(graph: torch.cuda.CUDAGraph) -> float:
    """Median over replays of one graph replay's time / CALLS, the ranks lined up before each."""
    return statistics.median(per_call_us(graph.replay, REPLAYS, CALLS, before=dist.barrier))


def _med(xs: list[float]) -> float:
    return round(statistics.median(xs) / 1000, 2) if xs else float("nan")


def _traced(case) -> dict:  # type: ignore[no-untyped-def]
    graph = capture_calls(case.call, CALLS)
    per_call = _per_call_us(graph)
    calls = (read_traces(case.prepared.kernel.err, len(case.prepared.table.row_names))[-CALLS:]
             if case.prepared.kernel.trace else [])
    gaps = [b.start_ns - a.end_ns for a, b in zip(calls, calls[1:])]
    rows = [{ph: _med([c.rows[i][k] for c in calls]) for k, ph in enumerate(PHASES)}
            for i in range(min(len(c.rows) for c in calls))] if calls else []
    return {"per_call_us": round(per_call, 2), "kernel_us": _med([c.kernel_ns for c in calls]),
            "gap_us": _med(gaps), "rows": rows, "calls_traced": len(calls)}


def main() -> None:
    probe = start(__doc__)
    results = []
    for n, spec in sizes(probe):
        for case in cases(probe, n, spec):
            row = _traced(case)
            row.update(case=f"{case.algorithm}-{n}", rank=probe.rank,
                       row_names=list(case.prepared.table.row_names),
                       fused=case.prepared.program.fused)
            results.append(row)
        for peer in peers_for(spec, ("torch-one-shot", "torch-two-shot", "torch-reduce-scatter",
                                     "nccl"), probe.device, torch.bfloat16):
            graph = capture_calls(peer.call, CALLS)
            results.append({"case": f"{peer.name}-{n}", "rank": probe.rank,
                            "per_call_us": round(_per_call_us(graph), 2)})
    finish(probe, results, "trace_small.json", show_ranks={0, probe.world - 1})


if __name__ == "__main__":
    main()
