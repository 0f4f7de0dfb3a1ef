#!/bin/bash
# Measured per-op timelines on ONE H200 (every rank in one process; one op per launch, CUDA
# events around each): what `hiercoll compare --timeline` overlays on the simulated timeline.
#   bash bench/gpu/one_gpu_timeline.sh     ($OUT/timelines.tgz: plans + timelines + log)
source bench/gpu/env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
D=$OUT/timelines; mkdir -p "$D"
for spec in all_reduce:ring:1MiB all_reduce:ring:64MiB all_reduce:direct:1MiB \
            all_reduce:two_shot:64MiB reduce_scatter:ring:16MiB all_gather:direct:16MiB; do
  IFS=: read -r c a b <<< "$spec"
  tag="${c}_${a}_${b}"
  python3 -m hiercoll plan -t one-gpu-h200x4 -c "$c" -b "$b" -a "$a" -o "$D/$tag.plan.json" > /dev/null
  timeout -k 5 120 python3 -m hiercoll run "$D/$tag.plan.json" --backend cuda --one-gpu --check \
    --iters 5 --debug-timeout-ms 5000 --profile "$D/$tag.timeline.json" 2>&1 | tail -2
done
cd "$OUT" && tar czf timelines.tgz timelines && rm -rf timelines
