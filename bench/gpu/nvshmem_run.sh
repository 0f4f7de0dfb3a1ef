#!/bin/bash
# Issue 27 on one host: the NVSHMEM inter-node transport on W GPUs mapped as nodes
# (T: bench/gpu/topologies/h200-2node-x1.yaml on 2 GPUs, h200-2node-x2.yaml on 4). Each phase is
# one torchrun (a comma list of collectives: one start-up), so a phase list fits one device call:
#   stress: every collective x family with --inter-transport nvshmem (fresh random inputs,
#           eager + graph, debug timeouts);
#   wl:     the attention and MoE front ends' group_cast / group_reduce plans (stress; and the
#           bench with every transport in WL_TRANSPORTS);
#   tp:     the 13 TP shapes x hidden 2880/4096, 2000 / 200 iterations, hier all-reduce over NVSHMEM
#           (TP_SMALL / TP_LARGE: other M lists, e.g. the cases an earlier call did not reach;
#           TP_HIDDEN: the hidden sizes);
#   bench:  hier / hier_2d / hier_tiers with the transports in TRANSPORTS, flat NCCL as the peer
#           row, graph mode (BENCH_MODES: eager for the nccl transport, which graph capture
#           refuses), zero-copy (the seed's case: reduce_scatter 1 MiB..1 GiB).
# W=4 T=bench/gpu/topologies/h200-2node-x2.yaml PHASES="stress wl tp" bash bench/gpu/nvshmem_run.sh
# ($OUT/nvshmem-wW.tgz: every log and JSON)
source bench/gpu/env.sh
# one host: no InfiniBand (NVSHMEM would fail to init its remote transport); the heap holds every
# symmetric allocation of a process (plans are never freed: symm.py says why)
export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-40G}
W=${W:-2}; T=${T:-bench/gpu/topologies/h200-2node-x1.yaml}
D=/tmp/nvshmem-w$W; mkdir -p "$D"
pack() { tar czf "$OUT/nvshmem-w$W.tgz" -C "$D" .; }
# a step's summary line, and everything so far packed (a call cut by its time limit keeps it)
count() { echo "$1 rc=$2 ok $(grep -c '^ok' $3) FAIL $(grep -c '^FAIL' $3)"; grep -m5 "^FAIL\|timed out\|Error" $3; pack; }
ALGOS=${ALGOS:-hier,hier_2d,hier_tiers}
for phase in ${PHASES:-stress wl tp bench}; do
  case $phase in
  stress)
    HC_TIMEOUT=${STRESS_S:-300} hc $W stress --backend cuda -c ${STRESS:-all_reduce,reduce_scatter,all_gather,all_to_all} \
      -t $T --inter-transport nvshmem --sizes ${STRESS_SIZES:-8KiB,1000002,4MiB} --iters ${ITERS:-10} \
      --modes eager,graph --debug-timeout-ms 3000 --out $D/stress.json > $D/stress.log 2>&1
    count stress $? $D/stress.log ;;
  wl)
    # the de-duplicated group_cast / group_reduce plans (hier: one inter-node copy per destination
    # node), made here on the CPU: MagiAttention-style varlen causal attention and a MoE
    # dispatch/combine
    python3 -m hiercoll workload attention --cu-seqlens 0,3000,5000,8192,12000,16384 --chunk-size 512 \
      -t $T --row-bytes 1KiB --out $D/wl-attention > $D/wl-attention.log 2>&1
    python3 -m hiercoll workload moe --tokens 1024 --topk 4 --experts 32 -t $T --out $D/wl-moe > $D/wl-moe.log 2>&1
    for plan in $D/wl-attention/group_cast.${WL_ALGOS:-*}.json $D/wl-moe/group_*.${WL_ALGOS:-*}.json; do
      tag=$(basename $(dirname $plan))-$(basename $plan .json)
      if [ -n "${WL_STRESS-1}" ]; then     # WL_STRESS= : the bench only
        HC_TIMEOUT=${WL_S:-90} hc $W stress $plan --backend cuda --inter-transport nvshmem --iters ${WL_ITERS:-20} \
          --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-$tag.json > $D/stress-$tag.log 2>&1
        count "stress $tag" $? $D/stress-$tag.log
      fi
      for tr in ${WL_TRANSPORTS-nvshmem nccl peer}; do
        HC_TIMEOUT=${WL_S:-90} hc $W bench $plan --backend cuda --modes graph --zero-copy --peers none \
          --inter-transport $tr --out $D/bench-wl-$tag-$tr > $D/bench-$tag-$tr.log 2>&1
        echo "bench $tag $tr rc=$?"; grep "p50" $D/bench-$tag-$tr.log | head -4; pack
      done
    done ;;
  tp)
    # TP_SMALL / TP_LARGE: the M values of each run (default the 13 shapes); an empty one skips it
    for v in "small ${TP_SMALL-1,2,4,8,16,32,64,128,512} 2000" "large ${TP_LARGE-1024,4096,8192,16384} 200"; do
      [ $(echo $v | wc -w) = 3 ] || continue
      set -- $v
      HC_TIMEOUT=${TP_S:-200} hc $W stress --backend cuda -c all_reduce -t $T --algorithms hier \
        --inter-transport nvshmem --shapes $2 --hidden ${TP_HIDDEN:-2880,4096} --iters $3 --modes eager,graph --out $D/stress-tp-$1.json \
        > $D/stress-tp-$1.log 2>&1
      count "stress tp $1" $? $D/stress-tp-$1.log
    done ;;
  bench)
    for tr in ${TRANSPORTS:-nvshmem nccl peer}; do
      for v in "${BENCH:-all_reduce,all_gather,all_to_all}:${SIZES-1MiB,16MiB,256MiB}" \
               "reduce_scatter:${RS_SIZES-1MiB,4MiB,16MiB,64MiB,256MiB,1GiB}"; do
        c=${v%%:*}; sizes=${v#*:}; tag=$tr-${c//,/-}
        [ -n "$sizes" ] || continue       # RS_SIZES= (or SIZES=): skip that row of collectives
        HC_TIMEOUT=${BENCH_S:-150} hc $W bench --backend cuda -c $c -t $T --algorithms $ALGOS --sizes $sizes \
          --modes ${BENCH_MODES:-graph} --zero-copy --peers nccl --inter-transport $tr --out $D/bench-$tr > $D/bench-$tag.log 2>&1
        echo "bench $tag rc=$?"; grep "p50" $D/bench-$tag.log; pack
      done
    done ;;
  esac
  pack
done
