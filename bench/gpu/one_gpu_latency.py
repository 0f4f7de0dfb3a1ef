"""What the cuda lowering costs on one GPU, with every rank in this process (no NVLink): the
per-call time of small all-reduces replayed from CUDA graphs (the fixed cost of our kernels,
signals and barriers, all ranks sharing one GPU's SMs) and the copy bandwidth of the Triton push
kernel against the copy engine. Writes JSON and Markdown to --out.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python3 bench/gpu/one_gpu_latency.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.common import stamp  # noqa: E402
from bench.gpu.replay_timing import per_call_us  # noqa: E402
from hiercoll.collectives import CollectiveSpec, Kind  # noqa: E402
from hiercoll.executor.cuda.lowering import CudaOptions  # noqa: E402
from hiercoll.executor.cuda.one_gpu import OneGpuCluster  # noqa: E402
from hiercoll.executor.torch_dtypes import torch_dtype  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.planner import plan  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402

TOPOS = {2: "bench/gpu/topologies/h200x2.yaml", 4: "h200x4"}


def _tensors(spec: CollectiveSpec, dev: torch.device):  # type: ignore[no-untyped-def]
    dt = torch_dtype(spec.dtype)
    w = spec.world_size
    ins = [torch.randn(spec.input_count(r), device=dev).to(dt) for r in range(w)]
    outs = [torch.empty(spec.output_count(r), dtype=dt, device=dev) for r in range(w)]
    return ins, outs


def graph_latency(world: int, algo: str, nbytes: int, fuse: bool, zero_copy: bool,
                  calls: int = 50, reps: int = 20) -> float:
    """Median microseconds per call over `reps` replays of the ranks' graphs, each holding
    `calls` back-to-back calls (single-stream lowering, as graph mode uses)."""
    topo = load_topology(TOPOS[world])
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=world, dtype="bf16", nbytes=nbytes)
    cluster = OneGpuCluster(plan(topo, spec, algo).expand(),
                            CudaOptions(single_stream=True, fuse=fuse))
    ins, outs = _tensors(spec, cluster.device)
    if zero_copy:     # the caller's tensors are the symmetric buffers: no copy-in/copy-out
        ins = [p.input_view for p in cluster.prepared]
        outs = [p.output_view for p in cluster.prepared]
    graphs = cluster.capture(ins, outs, calls)
    graphs.replay()
    times = per_call_us(graphs.replay, reps, calls)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(nbytes: int, engine: str) -> float:
    """GB/s of one 2-rank all-gather's pushes (each rank writes nbytes/2 to the other), eager."""
    topo = load_topology(TOPOS[2])
    spec = CollectiveSpec(kind=Kind.ALL_GATHER, world_size=2, dtype="bf16", nbytes=nbytes)
    threshold = 1 if engine == "ce" else 1 << 40
    cluster = OneGpuCluster(plan(topo, spec, "direct").expand(),
                            CudaOptions(ce_threshold_bytes=threshold, ctas=16))
    ins, outs = _tensors(spec, cluster.device)
    for _ in range(3):
        cluster.run(ins, outs)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 20
    start.record()
    for _ in range(n):
        cluster.run(ins, outs)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / n
    return nbytes / seconds / 1e9      # both ranks together move nbytes per call


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    variants = {"unfused": (False, False), "fused": (True, False), "fused-zero-copy": (True, True)}
    for world in (2, 4):
        for algo in ("direct", "two_shot", "ring"):
            for nbytes in (8 << 10, 64 << 10, 512 << 10):
                for name, (fuse, zero_copy) in variants.items():
                    us = graph_latency(world, algo, nbytes, fuse, zero_copy)
                    rows.append({"what": f"graph_us_{name}", "world": world, "algorithm": algo,
                                 "nbytes": nbytes, "value": round(us, 2)})
                    print(rows[-1], flush=True)
    for engine in ("sm", "ce"):
        for nbytes in (16 << 20, 256 << 20):
            gbps = copy_bandwidth(nbytes, engine)
            rows.append({"what": "copy_GBps", "world": 2, "algorithm": f"direct-{engine}",
                         "nbytes": nbytes, "value": round(gbps, 1)})
            print(rows[-1], flush=True)
    out = Path(args.out)
    meta = stamp(" ".join(sys.argv)) | {"device": torch.cuda.get_device_name(),
                                        "torch": torch.__version__}
    write_atomic(out / "one_gpu_latency.json", json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# One-GPU cost of the cuda lowering (all ranks in one process, no NVLink)", "",
             "graph_us_*: microseconds per all-reduce call, every rank's graph holding 50 calls, "
             "all ranks' graphs sharing one GPU (an upper bound on one rank's cost). copy_GBps: "
             "a 2-rank all-gather (eager, host-launched) moving its bytes within one GPU's HBM.",
             "",
             f"`{meta.get('command', '')}` on {meta['device']}, torch {meta['torch']}, "
             f"{meta.get('date', '')}", "", "| what | world | algorithm | bytes | value |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['what']} | {r['world']} | {r['algorithm']} | {r['nbytes']} | {r['value']} |"
              for r in rows]
    write_atomic(out / "one_gpu_latency.md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
