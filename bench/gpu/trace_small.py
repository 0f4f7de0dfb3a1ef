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

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hiercoll.collectives import CollectiveSpec, Kind  # noqa: E402
from hiercoll.executor.cuda.backend import CudaBackend  # noqa: E402
from hiercoll.executor.cuda.kernel_trace import PHASES, read_traces  # noqa: E402
from hiercoll.executor.graphs import capture_calls  # noqa: E402
from hiercoll.harness.peers import peers_for  # noqa: E402
from hiercoll.planner import plan  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402

CALLS = 10
REPLAYS = 20


def _per_call_us(graph: torch.cuda.CUDAGraph) -> float:
    """Median over replays of one graph replay's time / CALLS (cuda events)."""
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / CALLS)
    return statistics.median(times)


def _med(xs: list[float]) -> float:
    return round(statistics.median(xs) / 1000, 2) if xs else float("nan")


def _traced(prepared, backend, n_rows: int) -> dict:  # type: ignore[no-untyped-def]
    inp, out = prepared.input_view, prepared.output_view
    inp.copy_(torch.randn(inp.numel(), device=inp.device).to(inp.dtype))
    graph = capture_calls(lambda: backend.run(prepared, inp, out), CALLS)
    per_call = _per_call_us(graph)
    calls = read_traces(prepared.kernel.err, n_rows)[-CALLS:]
    gaps = [b.start_ns - a.end_ns for a, b in zip(calls, calls[1:])]
    rows = [{ph: _med([c.rows[i][k] for c in calls]) for k, ph in enumerate(PHASES)}
            for i in range(min(len(c.rows) for c in calls))] if calls else []
    return {"per_call_us": round(per_call, 2), "kernel_us": _med([c.kernel_ns for c in calls]),
            "gap_us": _med(gaps), "rows": rows, "calls_traced": len(calls)}


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
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=world, dtype="bf16", nbytes=n)
        for algo in args.algorithms.split(","):
            backend = CudaBackend(single_stream=True)
            prepared = backend.prepare(plan(topo, spec, algo).expand())
            names = prepared.table.row_names
            row = _traced(prepared, backend, len(names))
            row.update(case=f"{algo}-{n}", rank=rank, row_names=list(names),
                       fused=prepared.program.fused)
            results.append(row)
        for peer in peers_for(spec, ("torch-one-shot", "torch-two-shot", "nccl"), dev, torch.bfloat16):
            graph = capture_calls(peer.call, CALLS)
            results.append({"case": f"{peer.name}-{n}", "rank": rank,
                            "per_call_us": round(_per_call_us(graph), 2)})
    gathered: list = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        flat = [r for rs in gathered for r in rs]
        (args.out / "trace_small.json").write_text(json.dumps(flat, indent=1) + "\n")
        for r in flat:
            if r["rank"] in (0, world - 1):
                print(json.dumps(r))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
