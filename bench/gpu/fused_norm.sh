#!/bin/bash
# Fused all-reduce + residual add + RMSNorm on ONE GPU (every rank in one process): the
# regression stress (13 shapes x hidden 2880/4096, bf16, eager and graph, ITERS iterations), the
# ordering negatives (RELEASE/ACQUIRE/ACQUIRE_ALL_THREADS off), and the bench (fused vs unfused,
# p50/p90/p99, the stage-choice fit). Results under $OUT/fused_norm.
source bench/gpu/env.sh
D=$OUT/fused_norm; mkdir -p "$D"
export CUDA_DEVICE_MAX_CONNECTIONS=32
W=${WORLD:-4}
timeout -k 5 "${STRESS_S:-200}" python3 -m hiercoll stress --fused-rmsnorm --one-gpu --backend cuda \
  --world "$W" --iters "${ITERS:-2000}" --modes eager,graph --debug-timeout-ms 5000 \
  --out "$D/stress_w$W.json" > "$D/stress_w$W.log" 2>&1
echo "== stress rc=$? $(grep -c '^ok' "$D/stress_w$W.log") ok $(grep -c '^FAIL' "$D/stress_w$W.log") FAIL"
tail -3 "$D/stress_w$W.log"
if [ "${W8_ITERS:-100}" -gt 0 ]; then   # 8 ranks on the one GPU (16 CTAs each: 128 resident)
  timeout -k 5 60 python3 -m hiercoll stress --fused-rmsnorm --one-gpu --backend cuda --world 8 \
    --iters "${W8_ITERS:-100}" --modes eager,graph --debug-timeout-ms 5000 \
    --out "$D/stress_w8_${W8_ITERS:-100}.json" > "$D/stress_w8_${W8_ITERS:-100}.log" 2>&1
  echo "== w8 rc=$? $(grep -c '^ok' "$D/stress_w8_${W8_ITERS:-100}.log") ok"
fi
timeout -k 5 "${NEG_S:-60}" python3 bench/gpu/fused_norm_negatives.py --world "$W" --iters "${NEG_ITERS:-300}" \
  > "$D/negatives.log" 2>&1; echo "== negatives rc=$?"; cat "$D/negatives.log" | tail -12
timeout -k 5 "${BENCH_S:-200}" python3 bench/fused_norm.py --world "$W" --reps "${REPS:-100}" \
  --out "$D" --fit ${BENCH_ARGS:-} > "$D/bench.log" 2>&1; echo "== bench rc=$?"
tail -4 "$D/bench.log" | cut -c1-400
