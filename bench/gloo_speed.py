"""hiercoll's gloo backend against torch's own gloo all-reduce, same processes, same run (issue
30: 16 MiB two_shot took ~3.3 s a call against torch's 37 ms).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 bench/gloo_speed.py

Median of --iters calls each, slowest rank, wall clock with a barrier before each call. Writes
bench/results/gloo_speed.json and .md (rank 0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hiercoll as hc  # noqa: E402
from bench.common import provenance, stamp, write_results  # noqa: E402
from hiercoll.executor.gloo import GlooBackend  # noqa: E402


def _median_ms(call, iters: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1048576,16777216")
    ap.add_argument("--iters", type=int, default=7)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    topo = hc.load_topology("h200x4" if world == 4 else "dgx-h100", nodes=1 if world == 8 else None)
    rows = []
    for nbytes in (int(x) for x in args.sizes.split(",")):
        spec = hc.CollectiveSpec(kind="all_reduce", world_size=world, nbytes=nbytes)
        x = torch.randn(spec.input_count(rank)).to(torch.bfloat16)
        torch_ms = _median_ms(lambda x=x: dist.all_reduce(x), args.iters)
        for algo in ("ring", "two_shot"):
            backend = GlooBackend()
            prepared = backend.prepare(hc.plan(topo, spec, algo).expand())
            out = torch.empty(spec.output_count(rank), dtype=torch.bfloat16)
            backend.run(prepared, x, out)
            ms = _median_ms(lambda b=backend, p=prepared, i=x, o=out: b.run(p, i, o), args.iters)
            rows.append({"nbytes": nbytes, "algorithm": algo, "hiercoll_ms": ms,
                         "torch_gloo_ms": torch_ms, "ratio": ms / torch_ms})
    if rank == 0:
        meta = stamp(f"OMP_NUM_THREADS=1 torchrun --nproc-per-node {world} bench/gloo_speed.py")
        lines = [f"# gloo backend vs torch's gloo all_reduce, {world} CPU processes, bf16", "",
                 *provenance(meta), "",
                 "| bytes | algorithm | hiercoll ms | torch gloo ms | ratio (target <= 2) |",
                 "|---|---|---|---|---|"]
        lines += [f"| {r['nbytes']} | {r['algorithm']} | {r['hiercoll_ms']:.1f} | "
                  f"{r['torch_gloo_ms']:.1f} | {r['ratio']:.2f} |" for r in rows]
        write_results("gloo_speed", {"meta": meta, "world": world, "rows": rows},
                      "\n".join(lines) + "\n")
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
