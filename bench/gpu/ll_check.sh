#!/bin/bash
# First check of the LL lowering (executor/cuda/ll.py) on ONE GPU, every rank in one process:
# the one-hop plans (direct) of every collective at LL sizes, eager + graph, fresh inputs each
# iteration, debug timeouts on; auto (LL up to --ll-threshold) and forced LL at 1 MiB.
# Usage: bash bench/gpu/ll_check.sh   (results: $OUT/ll.tgz)
source bench/gpu/env.sh
D=$OUT/ll; mkdir -p "$D"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
for t in h200x4 bench/gpu/topologies/h200x2.yaml; do
  for c in all_reduce reduce_scatter all_gather all_to_all; do
    one_gpu "$D" "ll-$(basename "$t" .yaml)-$c" "${HC_TIMEOUT:-90}" -c "$c" -t "$t" --algorithms direct \
      --sizes 8KiB,64KiB,256KiB,1000008 --iters "${ITERS:-20}" --modes eager,graph
    one_gpu "$D" "llforced-$(basename "$t" .yaml)-$c" "${HC_TIMEOUT:-90}" -c "$c" -t "$t" --algorithms direct \
      --sizes 1MiB --iters 5 --modes eager,graph --protocol ll
  done
done
grep -h "^FAIL\|rror" "$D"/*.log | head -20
tar czf "$OUT/ll.tgz" -C "$OUT" ll
