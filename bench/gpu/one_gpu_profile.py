"""Where a small all-reduce call's time goes on one GPU (every rank in this process): a torch
profiler trace of graph replays (kernel durations, gaps between them), fused vs unfused, written
as Chrome/Perfetto traces and a table.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python3 bench/gpu/one_gpu_profile.py --out DIR
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
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from hiercoll.collectives import CollectiveSpec, Kind  # noqa: E402
from hiercoll.executor.cuda.lowering import CudaOptions  # noqa: E402
from hiercoll.executor.cuda.one_gpu import OneGpuCluster  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.planner import plan  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402

CALLS = 20


def profile_case(world: int, algo: str, nbytes: int, fuse: bool, out: Path) -> dict:
    topo = load_topology("bench/gpu/topologies/h200x2.yaml" if world == 2 else "h200x4")
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=world, dtype="bf16", nbytes=nbytes)
    cluster = OneGpuCluster(plan(topo, spec, algo).expand(),
                            CudaOptions(single_stream=True, fuse=fuse))
    ins = [p.input_view for p in cluster.prepared]
    outs = [p.output_view for p in cluster.prepared]
    for t in ins:
        t.copy_(torch.randn(t.numel(), device=t.device).to(t.dtype))
    graphs = cluster.capture(ins, outs, CALLS)
    graphs.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        graphs.replay()
        torch.cuda.synchronize()
    tag = f"w{world}-{algo}-{nbytes}-{'fused' if fuse else 'unfused'}"
    prof.export_chrome_trace(str(out / f"trace-{tag}.json"))
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    total_us = (spans[-1][1] - spans[0][0]) if spans else 0.0
    busy = sum(b - a for a, b in spans)
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:60], []).append(e.time_range.end - e.time_range.start)
    row = {"case": tag, "calls": CALLS, "span_us_per_call": round(total_us / CALLS, 2),
           "kernel_us_per_call": round(busy / CALLS, 2), "kernels_per_call": len(kernels) / CALLS,
           "by_kernel": {k: {"count": len(v), "mean_us": round(sum(v) / len(v), 2)}
                         for k, v in sorted(by_name.items())}}
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [profile_case(w, a, b, f, out) for w in (2, 4) for a in ("direct",)
            for b in (8 << 10,) for f in (False, True)]
    rows.append(profile_case(4, "two_shot", 512 << 10, True, out))
    write_atomic(out / "one_gpu_profile.json", json.dumps({"device": torch.cuda.get_device_name(),
                                                           "torch": torch.__version__,
                                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
