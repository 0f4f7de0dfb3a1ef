#!/bin/bash
# One 4-GPU device call: in-kernel stamps of small all-reduces (trace_small.py), hier/hier_2d
# against flat ring on the 2-nodes-x-2 mapping, and the TP-shape all-reduce stress.
# bash bench/gpu/trace_run.sh   (results under $OUT)
source bench/gpu/env.sh
set -o pipefail
T2=bench/gpu/topologies/h200-2node-x2.yaml
HIERCOLL_KERNEL_TRACE=1 timeout -k 5 ${TRACE_S:-150} torchrun --nproc-per-node 4 \
  --master-port $((29500 + RANDOM % 1000)) bench/gpu/trace_small.py --out $OUT \
  --sizes ${TRACE_SIZES:-8192,65536,262144} 2>&1 | grep -v "^W1\|OMP_NUM\|\*\*\*\*" | tail -40
if [ -n "${HIER-1}" ]; then
  for c in all_reduce reduce_scatter; do
    HC_TIMEOUT=${HIER_S:-100} hc 4 bench --backend cuda -c $c -t $T2 --sizes 1MiB,16MiB,256MiB \
      --modes graph --zero-copy --algorithms ring,hier,hier_2d,nccl --out /tmp/hier-$c 2>&1 \
      | grep -v "^W1\|OMP_NUM\|\*\*\*\*" | tail -14
    cp /tmp/hier-$c/*.json $OUT/ 2>/dev/null
  done
fi
if [ -n "${TP-1}" ]; then
  HC_TIMEOUT=${TP_S:-250} hc 4 stress --backend cuda -c all_reduce -t h200x4 \
    --shapes 1,2,4,8,16,64,128,512 --hidden 2880,4096 --iters ${TP_ITERS:-2000} \
    --algorithms ${TP_ALGOS:-direct,two_shot} --modes eager,graph --debug-timeout-ms 3000 \
    --out $OUT/stress-tp.json 2>&1 | grep -v "^W1\|OMP_NUM\|\*\*\*\*" | tail -8
fi
