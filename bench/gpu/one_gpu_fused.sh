#!/bin/bash
# The fused lowering (one kernel per call, barriers riding on the op rows) on ONE GPU: the
# graph-mode sweep (where it applies: no copy-engine op), 2000 iterations of the TP shapes, the
# latency bench (unfused / fused / fused zero-copy) and the profile. Results in $OUT/fused.tgz.
source bench/gpu/env.sh
D=$OUT/fused; mkdir -p "$D"
for t in h200x4 bench/gpu/topologies/h200-2node-x2.yaml; do
  for c in all_reduce reduce_scatter all_gather all_to_all; do
    one_gpu "$D" "fused-$(basename "$t" .yaml)-$c" 40 -c "$c" -t "$t" --modes graph \
      --shapes 1,3,16,128,1024,4096,16384 --hidden 2880,4096 --iters "${ITERS:-10}" --max-seconds 2
  done
done
one_gpu "$D" fused-deep-h200x4-all_reduce 60 -c all_reduce -t h200x4 --modes graph --shapes 1,1024 \
  --hidden 4096 --iters 2000 --max-seconds 5
timeout -k 5 60 python3 bench/gpu/one_gpu_latency.py --out "$D" > "$D/latency.log" 2>&1; echo "== latency rc=$?"
timeout -k 5 60 python3 bench/gpu/one_gpu_profile.py --out "$D" 2>&1 | grep '^{' > "$D/profile.log"; echo "== profile rc=$?"
grep graph_us "$D/latency.log" | grep "'world': 2" | head -9
cut -c1-120 "$D/profile.log"
tar czf "$OUT/fused.tgz" -C "$OUT" fused && rm -rf "$D"
