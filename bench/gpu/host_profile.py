"""Where the host's time goes in an eager call of the cuda backend: every rank of a plan in this
process on one GPU (`OneGpuCluster`), back-to-back eager calls timed on the host (no sync), and
cProfile of the same calls, per plan. Eager calls below a few MiB are host-bound, so this is
what an eager user waits for (issue 25: "per-call host cost no worse than NCCL's").

    CUDA_DEVICE_MAX_CONNECTIONS=32 python3 bench/gpu/host_profile.py --out DIR

Writes DIR/host_profile.json and DIR/host_profile.txt (the cProfile tables)."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from hiercoll.collectives import CollectiveSpec, Kind  # noqa: E402
from hiercoll.executor.cuda.lowering import CudaOptions  # noqa: E402
from hiercoll.executor.cuda.one_gpu import OneGpuCluster  # noqa: E402
from hiercoll.gcpause import without_cyclic_gc  # noqa: E402
from hiercoll.harness.inputs import device_inputs  # noqa: E402
from hiercoll.planner import plan  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402

CASES = [("all_reduce", "direct", 8 << 10), ("all_reduce", "hier", 1 << 20),
         ("reduce_scatter", "ring", 64 << 10), ("all_to_all", "direct", 64 << 10)]
CALLS = 400


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    topo = load_topology("h200x4")
    dev = torch.device("cuda", 0)
    rows, text = [], []
    for kind, algo, nbytes in CASES:
        spec = CollectiveSpec(kind=Kind(kind), world_size=4, dtype="bf16", nbytes=nbytes)
        schedule = plan(topo, spec, algo)
        cluster = OneGpuCluster(schedule.expand(), CudaOptions())
        gen = torch.Generator(device=dev)
        gen.manual_seed(1)
        ins = [device_inputs(spec, r, dev, gen) for r in range(4)]
        outs = [torch.empty(spec.output_count(r), dtype=ins[0].dtype, device=dev) for r in range(4)]
        for _ in range(20):
            cluster.run(ins, outs)
        torch.cuda.synchronize()
        with without_cyclic_gc():
            t0 = time.perf_counter()
            for _ in range(CALLS):
                cluster.run(ins, outs)
            host = (time.perf_counter() - t0) / CALLS * 1e6
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(CALLS):
                cluster.run(ins, outs)
            prof.disable()
            torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        label = f"{kind} {algo} {nbytes} B"
        text.append(f"## {label}: host {host:.1f} us per call of 4 ranks "
                    f"({host / 4:.1f} per rank)\n{s.getvalue()}")
        rows.append({"case": label, "host_us_per_call": host, "host_us_per_rank": host / 4,
                     "notes": cluster.prepared[0].notes})
        print(text[-1].splitlines()[0], flush=True)
        del cluster
    (out / "host_profile.json").write_text(json.dumps({"calls": CALLS, "rows": rows}, indent=1))
    (out / "host_profile.txt").write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
