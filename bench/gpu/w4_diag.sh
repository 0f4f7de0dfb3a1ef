#!/bin/bash
# One 4-GPU call after the first (w4_mid.sh) found the TP transformer's fused path wrong at TP 4:
# the transformer at TP 4 as run, without the communicator's other plans, with every launch through
# Triton's JIT (HIERCOLL_JIT_LAUNCH=1), and at TP 2 on two of the GPUs; the fused stress of its
# shape; then where the 4-GPU mid band's time goes (in-kernel stamps of the simple protocol) and
# LL against simple at the small sizes.   bash bench/gpu/w4_diag.sh   (results under $OUT)
source bench/gpu/env.sh
tpm() {  # tpm TAG NPROC ARGS...: the transformer, short
  local tag=$1 n=$2; shift 2
  timeout -k 5 ${TP_S:-100} torchrun --nproc-per-node $n --master-port $((29500 + RANDOM % 1000)) \
    bench/tp_model.py --out $OUT/tp-$tag --steps ${STEPS:-20} --reps 3 "$@" > $OUT/tp-$tag.log 2>&1
  echo "== tp $tag rc=$? $(grep -o '"max_abs_diff_vs_nccl.*"first_step_over_bound": {[^}]*}' $OUT/tp-$tag.log)"
}
if [ -z "$SKIP_TP" ]; then
  tpm w4 4
  tpm w4-fused-alone 4 --skip-patched
  HIERCOLL_JIT_LAUNCH=1 tpm w4-jit 4 --skip-patched
  CUDA_VISIBLE_DEVICES=0,1 tpm w2 2 --skip-patched
  for v in bound jit; do
    HIERCOLL_JIT_LAUNCH=$([ $v = jit ] && echo 1 || echo 0) HC_TIMEOUT=90 hc 4 stress --fused-rmsnorm --backend cuda \
      --shapes 1,128 --hidden 4096 --iters 200 --modes eager,graph --debug-timeout-ms 10000 \
      --out $OUT/fstress-$v.json > $OUT/fstress-$v.log 2>&1
    echo "== fused stress ($v) rc=$? ok $(grep -c '^ok' $OUT/fstress-$v.log) FAIL $(grep -c '^FAIL' $OUT/fstress-$v.log)"
    grep "^FAIL" $OUT/fstress-$v.log | head -4
  done
fi
# LL (auto) against simple at the small sizes, every family, one process per protocol
for p in auto simple; do
  HC_TIMEOUT=${SMALL_S:-90} hc 4 bench --backend cuda -c all_reduce,reduce_scatter,all_gather,all_to_all -t h200x4 \
    --sizes ${SMALL_SIZES:-8KiB,32KiB,128KiB} --modes graph --zero-copy --peers nccl --protocol $p \
    --out $OUT/small-$p > $OUT/small-$p.log 2>&1
  echo "== small $p rc=$?"
done
probe() {  # probe TAG KIND SIZES ALGOS: in-kernel stamps, simple protocol
  local tag=$1 kind=$2 sizes=$3 algos=$4
  mkdir -p /tmp/st-$tag
  HIERCOLL_KERNEL_TRACE=1 timeout -k 5 ${PROBE_S:-80} torchrun --nproc-per-node 4 \
    --master-port $((29500 + RANDOM % 1000)) bench/gpu/trace_small.py --out /tmp/st-$tag \
    --kind $kind --sizes $sizes --algorithms $algos --protocol simple > $OUT/stamps-$tag.log 2>&1
  echo "== stamps $tag rc=$?"; cp /tmp/st-$tag/trace_small.json $OUT/stamps-$tag.json 2>/dev/null
}
probe ar all_reduce 1048576,4194304 two_shot,hier
probe ag all_gather 2097152 direct,hier_2d
probe rs reduce_scatter 2097152 direct
