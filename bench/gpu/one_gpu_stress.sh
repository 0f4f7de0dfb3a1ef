#!/bin/bash
# Stress sweep of the cuda backend on ONE GPU (every rank in one process, --one-gpu): 14 shapes
# (M = 1..16384 x hidden 2880/4096, bf16), every applicable algorithm, eager and graph replay,
# fresh random inputs each iteration; then a deep run (2000 iterations) of the TP shapes; then
# the one-GPU latency/bandwidth bench. Everything lands in $OUT/one_gpu.tgz.
source bench/gpu/env.sh
D=$OUT/one_gpu; mkdir -p "$D"
for t in h200x4 bench/gpu/topologies/h200-2node-x2.yaml; do
  for c in all_reduce reduce_scatter all_gather all_to_all; do
    one_gpu "$D" "stress-$(basename "$t" .yaml)-$c" "${SWEEP_S:-50}" -c "$c" -t "$t" \
      --shapes 1,3,16,128,1024,4096,16384 --hidden 2880,4096 --iters "${ITERS:-20}" \
      --max-seconds 2 --modes eager,graph
  done
done
for c in all_reduce reduce_scatter; do
  one_gpu "$D" "stress-deep-h200x4-$c" "${DEEP_S:-45}" -c "$c" -t h200x4 --shapes 1,16,128,1024 \
    --hidden 4096 --iters 2000 --max-seconds 4 --modes eager,graph
done
timeout -k 5 60 python3 bench/gpu/one_gpu_latency.py --out "$D" > "$D/latency.log" 2>&1; echo "== latency rc=$?"
tail -20 "$D/latency.log"
tar czf "$OUT/one_gpu.tgz" -C "$OUT" one_gpu && rm -rf "$D"
