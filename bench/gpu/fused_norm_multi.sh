#!/bin/bash
# Fused all-reduce + residual add + RMSNorm across W GPUs (one process per GPU, symmetric memory):
# the regression stress (13 shapes x hidden 2880/4096, bf16, eager and graph, ITERS iterations;
# the seed's primary repro is W=8) and the bench (fused vs NCCL all-reduce + torch add + RMSNorm,
# rank-averaged p50/p90/p99, the stage-choice fit). Not run yet: written for when several GPUs
# are lent. Usage: W=8 bash bench/gpu/fused_norm_multi.sh
source bench/gpu/env.sh
D=$OUT/fused_norm_multi; mkdir -p "$D"
W=${W:-$(nvidia-smi -L | wc -l)}
HC_TIMEOUT=${STRESS_S:-500} hc "$W" stress --fused-rmsnorm --backend cuda --iters "${ITERS:-2000}" \
  --modes eager,graph --debug-timeout-ms 10000 --out "$D/stress_w$W.json" > "$D/stress_w$W.log" 2>&1
echo "== stress w$W rc=$? $(grep -c '^ok' "$D/stress_w$W.log") ok $(grep -c '^FAIL' "$D/stress_w$W.log") FAIL"
timeout -k 5 "${BENCH_S:-300}" torchrun --nproc-per-node "$W" --master-port $((29500 + RANDOM % 1000)) \
  bench/fused_norm.py --group --reps "${REPS:-100}" --out "$D" --fit > "$D/bench_w$W.log" 2>&1
echo "== bench w$W rc=$?"; tail -3 "$D/bench_w$W.log" | cut -c1-300
