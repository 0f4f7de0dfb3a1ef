#!/bin/bash
# The last minutes of device time: the stress of every collective x family with the commit's
# lowering (fresh random inputs, eager + graph, debug timeouts), all collectives in one process.
# W=2 bash bench/gpu/final_check.sh   (results: $OUT/final-check.json, .log)
source bench/gpu/env.sh
W=${W:-2}; T=${T:-bench/gpu/topologies/h200x2.yaml}
HC_TIMEOUT=${S:-140} hc $W stress --backend cuda -c all_reduce,reduce_scatter,all_gather,all_to_all -t $T \
  --sizes ${SIZES:-8KiB,1000002,4MiB} --iters 3 --modes eager,graph --debug-timeout-ms 3000 \
  --out $OUT/final-check.json > $OUT/final-check.log 2>&1
echo "== stress rc=$? ok $(grep -c '^ok' $OUT/final-check.log) FAIL $(grep -c '^FAIL' $OUT/final-check.log)"
grep '^FAIL' $OUT/final-check.log | head
