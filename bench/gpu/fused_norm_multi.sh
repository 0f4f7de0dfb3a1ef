#!/bin/bash
# Fused all-reduce + residual add + RMSNorm across W GPUs (one process per GPU, symmetric memory),
# in one device call:
# 1. a quick check (2 shapes x 20 iterations): stop here if the kernel is broken;
# 2. the regression stress: 13 shapes x hidden 2880/4096, bf16, eager and graph, ITERS (2000)
#    iterations up to 4.7 MB and 200 above, fresh random inputs, ranks compared bit for bit;
#    2b. the LL form (stage 3) forced on the shapes it takes (LL_SHAPES), the same stress;
# 3. the negatives: the same stress with one ordering rule dropped (NEG_ITERS iterations on
#    NEG_SHAPES): each must FAIL where the hardware exposes it;
# 4. the bench: fused vs NCCL / torch symm-mem / hiercoll all-reduce + torch add + RMSNorm,
#    graph and eager, with the stage-choice fit.
# Usage: W=4 T=h200x4 bash bench/gpu/fused_norm_multi.sh   (W=2 T=bench/gpu/topologies/h200x2.yaml)
# NEGATIVES="" skips 3, NO_BENCH=1 skips 4, SKIP_STRESS=1 skips 2 and 3.
source bench/gpu/env.sh
D=$OUT/fused_norm_multi; mkdir -p "$D"
W=${W:-$(nvidia-smi -L | wc -l)}
T=${T:-h200x4}
summary() { echo "== $1 rc=$2 $(grep -c '^ok' "$3") ok $(grep -c '^FAIL' "$3") FAIL"; }
HC_TIMEOUT=120 hc "$W" stress --fused-rmsnorm --backend cuda --iters 20 --shapes 1,2048 \
  --hidden 4096 --modes eager,graph --debug-timeout-ms 5000 > "$D/check_w$W.log" 2>&1
rc=$?; summary "check w$W" $rc "$D/check_w$W.log"
if [ $rc -ne 0 ]; then tail -20 "$D/check_w$W.log"; exit 1; fi
HC_TIMEOUT=120 hc "$W" stress --fused-rmsnorm --backend cuda --stage 3 --iters 20 --shapes 1,16 \
  --hidden 4096 --modes eager,graph --debug-timeout-ms 5000 > "$D/check_ll_w$W.log" 2>&1
rc_ll=$?; summary "check LL w$W" $rc_ll "$D/check_ll_w$W.log"
[ $rc_ll -ne 0 ] && tail -20 "$D/check_ll_w$W.log"
if [ -z "$SKIP_STRESS" ] && [ $rc_ll -eq 0 ]; then
  HC_TIMEOUT=${LL_STRESS_S:-200} hc "$W" stress --fused-rmsnorm --backend cuda --stage 3 \
    --iters "${LL_ITERS:-${ITERS:-2000}}" --shapes "${LL_SHAPES:-1,2,4,8,16,32}" --modes eager,graph \
    --debug-timeout-ms 10000 --out "$D/stress_ll_w$W.json" > "$D/stress_ll_w$W.log" 2>&1
  summary "stress LL w$W" $? "$D/stress_ll_w$W.log"
fi
if [ -z "$SKIP_STRESS" ]; then
  HC_TIMEOUT=${STRESS_S:-400} hc "$W" stress --fused-rmsnorm --backend cuda --iters "${ITERS:-2000}" \
    --large-iters 200 --modes eager,graph --debug-timeout-ms 10000 --out "$D/stress_w$W.json" \
    > "$D/stress_w$W.log" 2>&1
  summary "stress w$W" $? "$D/stress_w$W.log"
  for drop in ${NEGATIVES-release acquire all-threads-acquire}; do
    HC_TIMEOUT=${NEG_S:-60} hc "$W" stress --fused-rmsnorm --backend cuda --drop-ordering $drop \
      --iters "${NEG_ITERS:-300}" --large-iters 100 --shapes "${NEG_SHAPES:-1,64,1319,2048}" \
      --modes eager,graph --debug-timeout-ms 10000 --out "$D/negative_${drop}_w$W.json" \
      > "$D/negative_${drop}_w$W.log" 2>&1
    summary "negative $drop w$W" $? "$D/negative_${drop}_w$W.log"
  done
fi
[ -n "$NO_BENCH" ] || timeout -k 5 "${BENCH_S:-300}" torchrun --nproc-per-node "$W" --master-port $((29500 + RANDOM % 1000)) \
  bench/fused_norm.py --group --reps "${REPS:-50}" --topology "$T" --out "$D" --fit \
  ${SHAPES:+--shapes $SHAPES} > "$D/bench_w$W.log" 2>&1
echo "== bench w$W rc=$?"; tail -4 "$D/bench_w$W.log" | cut -c1-400
cat "$D/fused_norm_w$W.md" 2>/dev/null | tail -32
# one archive (the device tool returns at most 8 files), the table beside it
cp "$D/fused_norm_w$W.md" "$OUT/" 2>/dev/null
tar czf "$OUT/fused_norm_multi_w$W.tgz" -C "$OUT" fused_norm_multi && rm -rf "$D"
