#!/bin/bash
# The auto grid's cap at large sizes (issue 25): reduce-heavy plans at 64 MiB-1 GiB under
# --max-ctas 120 and 132 in one run, then the TP-shape all-reduce stress of the shapes the
# simple lowering runs (merged result copies), 2000 iterations, eager + graph.
# W=2 bash bench/gpu/grid_ab.sh   ($OUT/grid_ab.tgz)
source bench/gpu/env.sh
W=${W:-2}; T=${T:-bench/gpu/topologies/h200x2.yaml}; D=/tmp/grid_ab; mkdir -p $D
for cap in ${CAPS:-120 132}; do
  HC_TIMEOUT=${AB_S:-120} hc $W bench --backend cuda -c all_reduce,reduce_scatter -t $T \
    --sizes ${SIZES:-64MiB,256MiB,1GiB} --modes graph --zero-copy --peers none --max-ctas $cap \
    --algorithms ${ALGOS:-direct,two_shot,rhd} --out $D/cap$cap > $D/cap$cap.log 2>&1
  echo "== cap $cap rc=$?"; grep -h " graph " $D/cap$cap/*.md | awk -F'|' '{print $2,$4,$5}'
  tar -czf $OUT/grid_ab.tgz -C $D .
done
HC_TIMEOUT=${TP_S:-200} hc $W stress --backend cuda -c all_reduce -t $T --shapes ${TP_SHAPES:-64,128,512,1024} \
  --hidden 2880,4096 --iters ${TP_ITERS:-2000} --algorithms ${TP_ALGOS:-two_shot,direct,ring} \
  --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-tp.json > $D/stress-tp.log 2>&1
echo "tp stress rc=$? ok $(grep -c '^ok' $D/stress-tp.log) FAIL $(grep -c '^FAIL' $D/stress-tp.log)"
tar -czf $OUT/grid_ab.tgz -C $D .
