#!/bin/bash
# The fused lowering (one kernel per call) on ONE GPU: the graph-mode sweep (where it applies:
# no copy-engine op), the latency bench (unfused / fused / fused zero-copy), the GPU pytest.
source bench/gpu/env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
D=$OUT/fused; mkdir -p "$D"
for t in h200x4 bench/gpu/topologies/h200-2node-x2.yaml; do
  for c in all_reduce reduce_scatter all_gather all_to_all; do
    tag=$(basename "$t" .yaml)-$c
    timeout -k 5 40 python3 -m hiercoll stress --one-gpu --backend cuda --debug-timeout-ms 5000 \
      -c "$c" -t "$t" --shapes 1,3,16,128,1024,4096,16384 --hidden 2880,4096 --iters 20 \
      --max-seconds 2 --modes graph --out "$D/fused-$tag.json" > "$D/fused-$tag.log" 2>&1
    echo "== $tag rc=$? $(grep -c '^ok' "$D/fused-$tag.log") ok $(grep -c '^FAIL' "$D/fused-$tag.log") FAIL"
  done
done
timeout -k 5 120 python3 bench/gpu/one_gpu_latency.py --out "$D" > "$D/latency.log" 2>&1; echo "== latency rc=$?"
grep graph_us "$D/latency.log" | tail -60
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider tests/test_exec_kernels.py tests/test_exec_one_gpu.py -x 2>&1 | tail -5
tar czf "$OUT/fused.tgz" -C "$OUT" fused && rm -rf "$D"
