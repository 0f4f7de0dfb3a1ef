#!/bin/bash
# The session's last 4-GPU call, one archive ($OUT/w4-final.tgz, packed after every step so a cut
# call keeps what ran): the fused all-reduce + RMSNorm after the poll fix (13 shapes x hidden
# 2880/4096, eager + graph, fresh inputs) and the TP transformer at TP 4 and 2; the stress of
# every collective x family after the channel split and the LL unpack rule; the comparison table
# with the peers; in-kernel stamps of the mid band; the ordering negatives if time is left.
# bash bench/gpu/w4_final.sh
source bench/gpu/env.sh
D=/tmp/w4f; mkdir -p $D
pack() { tar czf "$OUT/w4-final.tgz" -C "$D" .; }
nvidia-smi -L > $D/gpus.txt
HC_TIMEOUT=${F_S:-130} hc 4 stress --fused-rmsnorm --backend cuda --iters ${F_ITERS:-100} \
  --large-iters ${F_LARGE:-20} --modes eager,graph --debug-timeout-ms 10000 --out $D/fstress-w4.json > $D/fstress-w4.log 2>&1
echo "== fused stress w4 rc=$? ok $(grep -c '^ok' $D/fstress-w4.log) FAIL $(grep -c '^FAIL' $D/fstress-w4.log)"; pack
OUT=$D W=4 TP_S=100 TP_ARGS="--steps 50 --reps 10" bash bench/gpu/tp_model.sh | head -3; pack
CUDA_VISIBLE_DEVICES=0,1 OUT=$D W=2 TP_S=80 TP_ARGS="--steps 50 --reps 10" bash bench/gpu/tp_model.sh | head -3; pack
for c in all_reduce reduce_scatter all_gather all_to_all; do
  HC_TIMEOUT=${STRESS_S:-60} hc 4 stress --backend cuda -c $c -t h200x4 --sizes ${STRESS_SIZES:-8KiB,1000002,4MiB} \
    --iters 5 --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-$c.json > $D/stress-$c.log 2>&1
  echo "== stress $c rc=$? ok $(grep -c '^ok' $D/stress-$c.log) FAIL $(grep -c '^FAIL' $D/stress-$c.log)"
done
pack
OUT=$D MODES=graph HC_TIMEOUT=${BENCH_S:-75} bash bench/gpu/compare.sh 4 h200x4 ${SIZES:-8KiB,256KiB,1MiB,4MiB,16MiB,1GiB} > $D/compare.log 2>&1
echo "== compare rc=$?"; rm -f $D/compare-w4.tgz; mv /tmp/compare-w4 $D/compare; pack
probe() {  # probe TAG KIND SIZES ALGOS PROTOCOL: in-kernel stamps
  mkdir -p /tmp/st-$1
  HIERCOLL_KERNEL_TRACE=1 timeout -k 5 ${PROBE_S:-50} torchrun --nproc-per-node 4 \
    --master-port $((29500 + RANDOM % 1000)) bench/gpu/trace_small.py --out /tmp/st-$1 \
    --kind $2 --sizes $3 --algorithms $4 --protocol $5 > $D/stamps-$1.log 2>&1
  echo "== stamps $1 rc=$?"; cp /tmp/st-$1/trace_small.json $D/stamps-$1.json 2>/dev/null; pack
}
probe ar all_reduce 1048576,4194304 two_shot,hier simple
probe rs reduce_scatter 2097152,4194304 direct,hier simple
probe ag all_gather 2097152 direct,hier_2d simple
for v in ${NEGATIVES-release acquire all-threads-acquire}; do
  HC_TIMEOUT=40 hc 4 stress --fused-rmsnorm --backend cuda --shapes 1,64,2048 --iters 100 \
    --modes eager,graph --drop-ordering $v --out $D/neg-$v.json > $D/neg-$v.log 2>&1
  echo "== negative $v rc=$? ok $(grep -c '^ok' $D/neg-$v.log) FAIL $(grep -c '^FAIL' $D/neg-$v.log)"; pack
done
