#!/bin/bash
# First check of the cuda backend's kernels on ONE GPU (every rank in one process, --one-gpu):
# every collective x applicable algorithm, 3 sizes (one CTA step, unaligned, copy-engine sized),
# debug timeouts on; graph replay with channel streams, and eager+graph with --single-stream.
# Usage: bash bench/gpu/one_gpu_smoke.sh [ITERS]
source bench/gpu/env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
one() {  # one TAG ARGS...
  local tag=$1; shift
  timeout -k 5 "${HC_TIMEOUT:-150}" python3 -m hiercoll stress --one-gpu --backend cuda \
    --sizes 8KiB,1000008,16MiB --iters "${ITERS:-5}" --debug-timeout-ms 3000 \
    --out "$OUT/smoke-$tag.json" "$@" 2>&1 | grep -E "^(ok|FAIL)|Error" | tail -40
  echo "== $tag rc=${PIPESTATUS[0]}"
}
for t in h200x4 bench/gpu/topologies/h200-2node-x2.yaml bench/gpu/topologies/h200x2.yaml; do
  for c in all_reduce reduce_scatter all_gather all_to_all; do
    tag=$(basename "$t" .yaml)-$c
    one "$tag-graph" -c "$c" -t "$t" --modes graph
    one "$tag-single" -c "$c" -t "$t" --modes eager,graph --single-stream
  done
done
