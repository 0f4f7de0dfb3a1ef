#!/bin/bash
# The TP-shape all-reduce stress (issue 25 section 4) for the shapes that take the simple lowering
# (above the LL threshold: M >= 64 at hidden 4096): 2000 iterations up to 4.7 MB, 200 above, eager
# and graph, fresh inputs, ranks compared, on the one-shot, two-shot and hier plans.
# W=2 T=bench/gpu/topologies/h200x2.yaml bash bench/gpu/tp_simple.sh   (results: $OUT/tp-simple-wW.tgz)
source bench/gpu/env.sh
W=${W:-2}; T=${T:-bench/gpu/topologies/h200x2.yaml}
D=/tmp/tp-simple; mkdir -p $D
for part in "64,128,512 ${TP_ITERS:-2000} ${SMALL_S:-200}" "1024,4096,8192,16384 200 ${LARGE_S:-200}"; do
  set -- $part
  HC_TIMEOUT=$3 hc $W stress --backend cuda -c all_reduce -t $T --algorithms ${ALGOS:-direct,two_shot,hier} \
    --shapes $1 --iters $2 --modes eager,graph --out $D/tp-$2.json > $D/tp-$2.log 2>&1
  echo "tp shapes $1 x $2: rc=$? ok $(grep -c '^ok' $D/tp-$2.log) FAIL $(grep -c '^FAIL' $D/tp-$2.log)"
  tar czf "$OUT/tp-simple-w$W.tgz" -C $D .
done
