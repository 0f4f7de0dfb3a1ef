#!/bin/bash
# One-GPU measurements for calibrating the simulator (every rank in one process on one GPU, the
# real kernels; what the simulator's one-gpu-h200x4 topology predicts): all-reduce (ring, direct,
# two_shot), reduce-scatter and all-gather (ring, direct), all-to-all (direct), 4 ranks, bf16,
# 8 KiB-256 MiB, eager and graph. Then a short correctness smoke of the same backend.
# The benches run in ONE Python process: eager calls are host-bound, and the host's speed
# differed by up to 1.5x between processes (all-gather 375 us, all-to-all 550 us per eager call
# with the same launches, 2026-11-25), which no cost model of the plans can follow. Within the
# process the host's speed also wandered (210 <-> 350 us over neighbouring points), so the
# host-bound eager points (8 KiB-4 MiB) are swept ROUNDS times in all (round 0 is the full
# eager+graph sweep), the process is held to two cores and the bench pauses Python's GC while
# it times; `hiercoll calibrate` takes each point's median over the rounds. A short probe first
# times two points alternately (stdout: probe.log) to tell a wandering host from a size effect.
#   bash bench/gpu/one_gpu_calibration.sh   ($OUT: bench JSON/MD per round and collective + logs)
source bench/gpu/env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
SIZES=${SIZES:-8KiB:256MiB} ROUNDS=${ROUNDS:-3}
timeout -k 5 "${HC_TIMEOUT:-480}" python3 - "$OUT" "$SIZES" "$ROUNDS" <<'PY' > "$OUT/bench.log" 2>&1
import os, sys, time
from hiercoll.cli.main import main
out, sizes, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
cores = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, set(cores[2:4] or cores))
print("affinity", sorted(os.sched_getaffinity(0)), flush=True)
from bench.gpu.one_gpu_probe import probe
probe(f"{out}/probe.log")
for k in range(rounds):
    for c, algos in [("all_reduce", "ring,direct,two_shot"), ("reduce_scatter", "ring,direct"),
                     ("all_gather", "ring,direct"), ("all_to_all", "direct")]:
        t0 = time.time()
        rc = main(["bench", "--one-gpu", "--backend", "cuda", "-c", c, "-t", "h200x4",
                   "--algorithms", algos, "--sizes", sizes if k == 0 else "8KiB:4MiB",
                   "--modes", "eager,graph" if k == 0 else "eager",
                   "--debug-timeout-ms", "5000", "--out", f"{out}/r{k}/{c}"])
        print(f"== bench round {k} {c} rc={rc} {time.time() - t0:.0f} s", flush=True)
PY
echo "== benches rc=$? rows $(grep -c 'p50' "$OUT/bench.log")"; grep "^== bench\|affinity" "$OUT/bench.log"
cat "$OUT/probe.log"
D=$OUT/smoke; mkdir -p "$D"
for c in all_reduce reduce_scatter all_gather all_to_all; do
  one_gpu "$D" "smoke-$c" 60 -c "$c" -t h200x4 --sizes 8KiB,1000008,16MiB --iters 5 \
    --modes eager,graph
done
cd "$OUT" && tar czf results.tgz r* smoke bench.log probe.log && rm -rf r[0-9]* smoke
