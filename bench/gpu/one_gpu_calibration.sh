#!/bin/bash
# One-GPU measurements for calibrating the simulator (every rank in one process on one GPU, the
# real kernels; what the simulator's one-gpu-h200x4 topology predicts): all-reduce (ring, direct,
# two_shot), reduce-scatter and all-gather (ring, direct), all-to-all (direct), 4 ranks, bf16,
# 8 KiB-256 MiB, eager and graph. Then a short correctness smoke of the same backend.
# The four benches run in ONE Python process: eager calls are host-bound, and the host's speed
# differed by up to 1.5x between processes (all-gather 375 us, all-to-all 550 us per eager call
# with the same launches, 2026-11-25), which no cost model of the plans can follow.
#   bash bench/gpu/one_gpu_calibration.sh   ($OUT: bench JSON/MD/PNG per collective + logs)
source bench/gpu/env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
SIZES=${SIZES:-8KiB:256MiB}
timeout -k 5 "${HC_TIMEOUT:-400}" python3 - "$OUT" "$SIZES" <<'PY' > "$OUT/bench.log" 2>&1
import sys
from hiercoll.cli.main import main
out, sizes = sys.argv[1], sys.argv[2]
for c, algos in [("all_reduce", "ring,direct,two_shot"), ("reduce_scatter", "ring,direct"),
                 ("all_gather", "ring,direct"), ("all_to_all", "direct")]:
    rc = main(["bench", "--one-gpu", "--backend", "cuda", "-c", c, "-t", "h200x4",
               "--algorithms", algos, "--sizes", sizes, "--modes", "eager,graph",
               "--debug-timeout-ms", "5000", "--out", f"{out}/{c}"])
    print(f"== bench {c} rc={rc}", flush=True)
PY
echo "== benches rc=$? rows $(grep -c 'p50' "$OUT/bench.log")"; grep "^== bench" "$OUT/bench.log"
D=$OUT/smoke; mkdir -p "$D"
for c in all_reduce reduce_scatter all_gather all_to_all; do
  one_gpu "$D" "smoke-$c" 120 -c "$c" -t h200x4 --sizes 8KiB,1000008,16MiB --iters 5 \
    --modes eager,graph
done
one_gpu "$D" "smoke-2node" 120 -c all_reduce -t bench/gpu/topologies/h200-2node-x2.yaml \
  --sizes 8KiB,1000008,16MiB --iters 5 --modes eager,graph
cd "$OUT" && tar czf results.tgz all_reduce reduce_scatter all_gather all_to_all smoke bench.log \
  && rm -rf all_reduce reduce_scatter all_gather all_to_all smoke bench.log
