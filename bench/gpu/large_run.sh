#!/bin/bash
# Issue 25's 1 MiB..1 GiB rows after forwarding copy-engine-sized operands of reduces and running a
# level's rows side by side (one device call): a stress of every collective x family at the sizes
# those changes touch (fresh random inputs, eager + graph, debug timeouts), compare.sh's table at
# 1 MiB..1 GiB with the peers, and (SM_ROWS=1) the all-gather / all-to-all rows with every copy on
# SMs (--ce-threshold 4GiB: the self copy and the pushes share the kernel's grid; the default since).
# W=2 T=bench/gpu/topologies/h200x2.yaml SM_ROWS=1 bash bench/gpu/large_run.sh   (results: $OUT/large-wW.tgz)
source bench/gpu/env.sh
W=${W:-2}; T=${T:-bench/gpu/topologies/h200x2.yaml}
D=/tmp/large-w$W; mkdir -p "$D"
pack() { tar czf "$OUT/large-w$W.tgz" -C "$D" .; }
for c in ${STRESS-all_reduce reduce_scatter all_gather all_to_all}; do
  HC_TIMEOUT=${STRESS_S:-100} hc $W stress --backend cuda -c $c -t $T --sizes ${STRESS_SIZES:-1000002,4MiB,16MiB} \
    --iters 5 --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-$c.json > $D/stress-$c.log 2>&1
  echo "stress $c rc=$? ok $(grep -c '^ok' $D/stress-$c.log) FAIL $(grep -c '^FAIL' $D/stress-$c.log)"
done
for c in ${SM_ROWS:+all_gather all_to_all}; do
  HC_TIMEOUT=${STRESS_S:-100} hc $W stress --backend cuda -c $c -t $T --sizes 16MiB --ce-threshold 4GiB \
    --iters 5 --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-sm-$c.json > $D/stress-sm-$c.log 2>&1
  echo "stress (all SM) $c rc=$? ok $(grep -c '^ok' $D/stress-sm-$c.log) FAIL $(grep -c '^FAIL' $D/stress-sm-$c.log)"
done
pack
OUT=$D HC_TIMEOUT=${BENCH_S:-200} bash bench/gpu/compare.sh $W $T ${SIZES:-1MiB,16MiB,256MiB,1GiB} > $D/compare.log 2>&1
echo "compare rc=$?"; rm -f $D/compare-w$W.tgz; mv /tmp/compare-w$W $D/compare; pack
mkdir -p $D/sm
for c in ${SM_ROWS:+all_gather all_to_all}; do
  HC_TIMEOUT=${BENCH_S:-200} hc $W bench --backend cuda -c $c -t $T --sizes ${SIZES:-1MiB,16MiB,256MiB,1GiB} \
    --modes graph --zero-copy --peers nccl --ce-threshold 4GiB --out $D/sm > $D/sm/bench-$c.log 2>&1
  echo "bench (all SM) $c rc=$?"; pack
done
# SWEEP=1: the all-reduce's 512 KiB..4 MiB band under other knobs (every CTA; LL forced)
if [ -n "$SWEEP" ]; then
  for v in "ctas120 --ctas 120" "ll --protocol ll" "simple --protocol simple"; do
    set -- $v; tag=$1; shift
    HC_TIMEOUT=${BENCH_S:-200} hc $W bench --backend cuda -c all_reduce -t $T --algorithms direct,two_shot \
      --sizes 256KiB,512KiB,1MiB,2MiB,4MiB --modes graph --zero-copy --peers none "$@" --out $D/sweep-$tag > $D/sweep-$tag.log 2>&1
    echo "sweep $tag rc=$?"; grep " graph " $D/sweep-$tag.log | grep p50; pack
  done
fi
