#!/bin/bash
# One device call after a small-message kernel change: the stress of every collective x family
# (fresh random inputs, eager + graph, debug timeouts), the in-kernel stamps, and the small-size
# comparison table with the peers.   W=4 T=h200x4 bash bench/gpu/small_run.sh
source bench/gpu/env.sh
set -o pipefail
W=${W:-4}; T=${T:-h200x4}
for c in ${STRESS-all_reduce reduce_scatter all_gather all_to_all}; do
  HC_TIMEOUT=${STRESS_S:-100} hc $W stress --backend cuda -c $c -t $T --sizes 8KiB,1000002,4MiB --iters 10 \
    --modes eager,graph --debug-timeout-ms 3000 --out $OUT/stress-$c.json 2>&1 \
    | grep -v "^W1\|OMP_NUM\|\*\*\*\*" | grep -c "^ok" | sed "s/^/$c ok: /"
done
HIERCOLL_KERNEL_TRACE=1 timeout -k 5 ${TRACE_S:-100} torchrun --nproc-per-node $W \
  --master-port $((29500 + RANDOM % 1000)) bench/gpu/trace_small.py --out $OUT \
  --sizes ${TRACE_SIZES:-8192,65536,262144} 2>&1 | grep -v "^W1\|OMP_NUM\|\*\*\*\*" | tail -3 | cut -c1-300
HC_TIMEOUT=${HCT:-100} bash bench/gpu/compare.sh $W $T ${SIZES:-8KiB,64KiB,256KiB,1MiB} \
  "${COLLS:-all_reduce reduce_scatter all_gather all_to_all}" > $OUT/compare.log 2>&1
grep graph $OUT/compare.log | grep -v "^ *$" | head -120
