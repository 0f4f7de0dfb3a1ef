#!/bin/bash
# A short multi-GPU check of the LL lowering when little device time is left: the stress of every
# all-reduce family at LL sizes (eager + graph, debug timeouts), then graph-mode benches of
# all_reduce and reduce_scatter at 8..256 KiB with the peers (NCCL, torch symm-mem), same run.
# Usage: W=4 T=h200x4 bash bench/gpu/ll_quick.sh   (results: $OUT/ll-quick-wW.tgz)
source bench/gpu/env.sh
W=${W:-4}; T=${T:-h200x4}
D=/tmp/ll-quick-w$W; mkdir -p "$D"
pack() { tar czf "$OUT/ll-quick-w$W.tgz" -C "$D" .; }
HC_TIMEOUT=${STRESS_S:-60} hc $W stress --backend cuda -c all_reduce -t $T --sizes 8KiB,64KiB,256KiB \
  --iters 10 --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-all_reduce.json > $D/stress.log 2>&1
echo "stress rc=$? ok $(grep -c '^ok' $D/stress.log) FAIL $(grep -c '^FAIL' $D/stress.log)"
pack
for c in ${COLLS:-all_reduce reduce_scatter}; do
  HC_TIMEOUT=${BENCH_S:-60} hc $W bench --backend cuda -c $c -t $T --sizes ${SIZES:-8KiB,64KiB,256KiB} \
    --modes graph --zero-copy --peers all --out $D > $D/bench-$c.log 2>&1
  echo "bench $c rc=$?"; grep -h " graph " $D/bench-$c.log | grep p50
  pack
done
