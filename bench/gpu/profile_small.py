"""Where a small all-reduce's time goes on real GPUs (one process per GPU): torch-profiler traces
of one replay of a 10-call graph, hiercoll's plan against torch's one-shot kernel in the same
process group. Per call: kernels, mean kernel duration, span (first start to last end / calls);
span minus kernel time is what launches and gaps cost.

    torchrun --nproc-per-node 4 bench/gpu/profile_small.py --out DIR [--sizes 8192,262144]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from hiercoll.collectives import CollectiveSpec, Kind  # noqa: E402
from hiercoll.executor.cuda.backend import CudaBackend  # noqa: E402
from hiercoll.executor.graphs import capture_calls  # noqa: E402
from hiercoll.harness.peers import peers_for  # noqa: E402
from hiercoll.planner import plan  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402

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
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", default="8192,262144")
    ap.add_argument("--algorithms", default="direct,two_shot,rd")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    args.out.mkdir(parents=True, exist_ok=True)
    topo = load_topology("h200x4" if world == 4 else "bench/gpu/topologies/h200x2.yaml")
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=world, dtype="bf16", nbytes=n)
        for algo in args.algorithms.split(","):
            backend = CudaBackend(single_stream=True)
            prepared = backend.prepare(plan(topo, spec, algo).expand())
            inp, out = prepared.input_view, prepared.output_view
            inp.copy_(torch.randn(inp.numel(), device=dev).to(inp.dtype))
            rows.append(_profiled(lambda b=backend, p=prepared, i=inp, o=out: b.run(p, i, o),
                                  f"{algo}-{n}", args.out, rank))
        for peer in peers_for(spec, ("torch-one-shot", "nccl"), dev, torch.bfloat16):
            rows.append(_profiled(peer.call, f"{peer.name}-{n}", args.out, rank))
    gathered: list = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        flat = [r for rs in gathered for r in rs]
        (args.out / "profile_small.json").write_text(json.dumps(flat, indent=1) + "\n")
        for r in flat:
            print(json.dumps(r))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
