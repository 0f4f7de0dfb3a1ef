"""Where a small all-reduce's time goes on real GPUs (one process per GPU): torch-profiler traces
of one replay of a 10-call graph, hiercoll's plan against torch's one-shot kernel in the same
process group. Per call: kernels, mean kernel duration, span (first start to last end / calls);
span minus kernel time is what launches and gaps cost.

    torchrun --nproc-per-node 4 bench/gpu/profile_small.py --out DIR [--sizes 8192,262144]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.gpu.small_cases import cases, finish, sizes, start  # noqa: E402
from hiercoll.executor.graphs import capture_calls  # noqa: E402
from hiercoll.harness.peers import peers_for  # noqa: E402

CALLS = 10


def _profiled(call, tag: str, out: Path, rank: int) -> dict:  # type: ignore[no-untyped-def]
    graph = capture_calls(call, CALLS)
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    if rank == 0:
        prof.export_chrome_trace(str(out / f"trace-{tag}.json"))
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    total = (spans[-1][1] - spans[0][0]) if spans else 0.0
    busy = sum(b - a for a, b in spans)
    return {"case": tag, "rank": rank, "kernels_per_call": len(kernels) / CALLS,
            "kernel_us_per_call": round(busy / CALLS, 2),
            "span_us_per_call": round(total / CALLS, 2)}


def main() -> None:
    probe = start(__doc__)
    rows = []
    for n, spec in sizes(probe):
        for case in cases(probe, n, spec):
            rows.append(_profiled(case.call, f"{case.algorithm}-{n}", probe.args.out, probe.rank))
        for peer in peers_for(spec, ("torch-one-shot", "nccl"), probe.device, torch.bfloat16):
            rows.append(_profiled(peer.call, f"{peer.name}-{n}", probe.args.out, probe.rank))
    finish(probe, rows, "profile_small.json")


if __name__ == "__main__":
    main()
