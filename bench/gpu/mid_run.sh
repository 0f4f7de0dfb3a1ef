#!/bin/bash
# The 256 KiB..64 MiB band of all_reduce / reduce_scatter after a lowering change (graph, peers), a
# stress at 1000002 B / 4 MiB / 16 MiB of every collective, and the eager table at 8 KiB..256 MiB.
# bash bench/gpu/mid_run.sh   (2 x H200; results: $OUT/mid-w2.tgz)
source bench/gpu/env.sh
D=/tmp/mid; mkdir -p $D; T=bench/gpu/topologies/h200x2.yaml
pack() { tar czf "$OUT/mid-w2.tgz" -C "$D" .; }
for c in all_reduce reduce_scatter all_gather all_to_all; do
  HC_TIMEOUT=100 hc 2 stress --backend cuda -c $c -t $T --sizes 1000002,4MiB,16MiB --iters 5 --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-$c.json > $D/stress-$c.log 2>&1
  echo "stress $c rc=$? ok $(grep -c '^ok' $D/stress-$c.log) FAIL $(grep -c '^FAIL' $D/stress-$c.log)"
done
pack
OUT=$D MODES=graph HC_TIMEOUT=200 bash bench/gpu/compare.sh 2 $T 256KiB,1MiB,2MiB,4MiB,16MiB,64MiB "all_reduce reduce_scatter" > $D/compare.log 2>&1
echo "compare rc=$?"; rm -f $D/compare-w2.tgz; mv /tmp/compare-w2 $D/compare; pack
OUT=$D MODES=eager HC_TIMEOUT=200 bash bench/gpu/compare.sh 2 $T 8KiB,1MiB,16MiB,256MiB > $D/compare-eager.log 2>&1
echo "compare eager rc=$?"; rm -f $D/compare-w2.tgz; mv /tmp/compare-w2 $D/compare-eager; pack
