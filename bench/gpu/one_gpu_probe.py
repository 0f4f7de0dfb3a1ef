"""Is the one-GPU eager time a property of the point or of the moment? Times two neighbouring
points of each of two plans in alternation (all-gather, 4 ranks on one GPU, eager, 200 calls a
trial): a size effect shows as a steady gap between the sizes, a wandering host as trials of one
point that move together with the other point's.

    python3 bench/gpu/one_gpu_probe.py OUT.log      (bench/gpu/one_gpu_calibration.sh runs it)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hiercoll.collectives import CollectiveSpec, Kind  # noqa: E402
from hiercoll.executor.cuda.lowering import CudaOptions  # noqa: E402
from hiercoll.executor.cuda.one_gpu import OneGpuCluster  # noqa: E402
from hiercoll.executor.interface import Mode  # noqa: E402
from hiercoll.harness.one_gpu_bench import time_one_gpu  # noqa: E402
from hiercoll.planner import plan  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402

POINTS = [("ring", 64 << 10), ("ring", 128 << 10), ("direct", 32 << 10), ("direct", 64 << 10)]


def probe(out: str, trials: int = 8) -> None:
    topo = load_topology("h200x4")
    clusters = {}
    for algo, nbytes in POINTS:
        spec = CollectiveSpec(kind=Kind.ALL_GATHER, world_size=4, dtype="bf16", nbytes=nbytes)
        clusters[(algo, nbytes)] = OneGpuCluster(plan(topo, spec, algo).expand(),
                                                 CudaOptions(debug_timeout_ms=5000))
    lines = ["trial  t_s  " + "  ".join(f"{a}@{n >> 10}KiB" for a, n in POINTS)]
    t0 = time.time()
    for k in range(trials):
        p50 = [time_one_gpu(clusters[p], Mode.EAGER, 200).p50_us for p in POINTS]
        lines.append(f"{k:5d} {time.time() - t0:4.1f}  " + "  ".join(f"{v:10.1f}" for v in p50))
    Path(out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    probe(sys.argv[1])
