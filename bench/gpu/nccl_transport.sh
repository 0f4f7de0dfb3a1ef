#!/bin/bash
# The nccl inter-transport on 4 GPUs mapped as 2 nodes x 2 (issue 27): stress of hier /
# hier_2d at SIZES (eager: NCCL send/recv cannot be captured), then the bench of hier
# reduce-scatter over nccl vs peer transports vs flat NCCL, eager. Logs under $OUT.
source bench/gpu/env.sh
T=${T:-bench/gpu/topologies/h200-2node-x2.yaml}
HC_TIMEOUT=${STRESS_S:-120} hc 4 stress --backend cuda -c ${STRESS:-reduce_scatter,all_reduce} -t $T \
  --algorithms ${ALGOS:-hier,hier_2d} --inter-transport nccl --sizes ${SIZES:-1MiB,4MiB,16MiB} \
  --iters ${ITERS:-5} --modes eager --debug-timeout-ms 20000 --out $OUT/stress-nccl.json > $OUT/stress-nccl.log 2>&1
echo "== stress rc=$? $(grep -c '^ok' $OUT/stress-nccl.log) ok $(grep -c '^FAIL' $OUT/stress-nccl.log) FAIL"
grep -E "timed out" $OUT/stress-nccl.log | head -3
for tr in nccl peer; do
  HC_TIMEOUT=${BENCH_S:-120} hc 4 bench --backend cuda -c reduce_scatter -t $T --algorithms hier \
    --sizes ${BENCH_SIZES:-1MiB,16MiB,256MiB} --modes eager --zero-copy --peers nccl \
    --inter-transport $tr --out $OUT/bench-$tr > $OUT/bench-$tr.log 2>&1
  echo "== bench $tr rc=$?"; grep -E "^\| (hier|nccl|peer)" $OUT/bench-$tr/*.md 2>/dev/null | head -12
done
