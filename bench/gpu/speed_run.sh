#!/bin/bash
# One device call of issue 25: a short stress of every collective x family (fresh random inputs,
# eager + graph, debug timeouts on) with the current kernels, then compare.sh's whole table.
# W=4 T=h200x4 SIZES=8KiB,64KiB,256KiB,1MiB,16MiB,256MiB,1GiB HCT=120 bash bench/gpu/speed_run.sh
# (STRESS= skips the stress; results under $OUT: stress-*.json, compare-wW.tgz, compare.log)
source bench/gpu/env.sh
set -o pipefail
W=${W:-2}; T=${T:-bench/gpu/topologies/h200x2.yaml}
for c in ${STRESS-all_reduce reduce_scatter all_gather all_to_all}; do
  HC_TIMEOUT=120 hc $W stress --backend cuda -c $c -t $T --sizes 8KiB,1000002,4MiB --iters 10 \
    --modes eager,graph --debug-timeout-ms 3000 --out $OUT/stress-$c.json 2>&1 | grep -v "^W1\|OMP_NUM\|\*\*\*\*" | grep -c "^ok"
done
HC_TIMEOUT=${HCT:-150} bash bench/gpu/compare.sh $W $T ${SIZES:-8KiB:1GiB:4} 2>&1 > $OUT/compare.log
grep -E "8KiB|32KiB|256KiB|128KiB|16MiB|1GiB|256MiB" $OUT/compare.log | grep graph | head -150
