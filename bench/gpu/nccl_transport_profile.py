"""Where an eager call of the nccl inter-transport spends its ~300 us (issue 27): torch-profiler
trace (CPU and CUDA) of a few calls of one plan, rank 0's trace written, and per rank the wall
time per call and the CPU ops that took the most of it.

    torchrun --nproc-per-node 4 bench/gpu/nccl_transport_profile.py \\
        --topology bench/gpu/topologies/h200-2node-x2.yaml --out DIR [--size 1MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from hiercoll.collectives import CollectiveSpec, Kind  # noqa: E402
from hiercoll.executor.backends import get_backend  # noqa: E402
from hiercoll.planner import plan  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402
from hiercoll.units import parse_size  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", required=True)
    ap.add_argument("--size", default="1MiB")
    ap.add_argument("--algorithm", default="hier")
    ap.add_argument("--transport", default="nccl")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = CollectiveSpec(kind=Kind.REDUCE_SCATTER, world_size=world, dtype="bf16",
                          nbytes=parse_size(args.size, "--size"))
    schedule = plan(load_topology(args.topology), spec, args.algorithm)
    backend = get_backend("cuda", inter_transport=args.transport)
    prepared = backend.prepare(schedule, None)
    inp = torch.randn(spec.input_count(rank), device="cuda").bfloat16()
    out = torch.empty(spec.output_count(rank), device="cuda").bfloat16()
    for _ in range(5):
        backend.run(prepared, inp, out)
    torch.cuda.synchronize()
    dist.barrier()
    walls = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            t0 = time.perf_counter()
            backend.run(prepared, inp, out)
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e6)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        prof.export_chrome_trace(str(outdir / f"trace-{args.transport}-{args.size}.json"))
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=18)
    cuda = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
    summary = {"rank": rank, "wall_us_per_call": [round(w, 1) for w in walls],
               "net_items": [type(x).__name__ for x in prepared.program.net]}
    (outdir / f"rank{rank}-{args.transport}-{args.size}.txt").write_text(
        json.dumps(summary) + "\n" + table + "\n" + cuda + "\n")
    print(json.dumps(summary), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
