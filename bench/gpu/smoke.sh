#!/bin/bash
# First GPU check: every collective x algorithm, small and medium sizes, eager and graph.
source bench/gpu/env.sh
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())"
for c in all_reduce reduce_scatter all_gather all_to_all; do
  HC_TIMEOUT=150 hc 4 stress --backend cuda -c $c -t h200x4 --sizes 8KiB,1000002,4MiB,32MiB --iters 10 \
    --modes eager,graph --debug-timeout-ms 3000 --out $OUT/smoke-$c.json 2>&1 | grep -v "^W1\|OMP_NUM\|\*\*\*\*" | tail -30
done
