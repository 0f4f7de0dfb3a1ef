#!/bin/bash
# Issue 27 on one host (one device call): the NVSHMEM inter-node transport on W GPUs mapped as
# nodes (T: bench/gpu/topologies/h200-2node-x1.yaml on 2 GPUs, h200-2node-x2.yaml on 4).
#   1. the stress of every collective x family with --inter-transport nvshmem (fresh random inputs,
#      eager + graph, debug timeouts); WORKLOADS=1: the attention and MoE front ends' group_cast /
#      group_reduce plans (stress and bench, every transport);
#   2. TP=1: the 13 TP shapes x 2000 / 200 iterations of the hier all-reduce over NVSHMEM;
#   3. the bench: hier / hier_2d / hier_tiers / ring with the nvshmem, nccl and peer transports,
#      flat NCCL as the peer row, graph mode, zero-copy (the seed's case: reduce_scatter 1 MiB..1 GiB).
# W=4 T=bench/gpu/topologies/h200-2node-x2.yaml bash bench/gpu/nvshmem_run.sh   ($OUT/nvshmem-wW.tgz)
source bench/gpu/env.sh
# one host: no InfiniBand (NVSHMEM would fail to init its remote transport); the heap holds every
# symmetric allocation of a process (plans are never freed: symm.py says why)
export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-40G}
W=${W:-2}; T=${T:-bench/gpu/topologies/h200-2node-x1.yaml}
D=/tmp/nvshmem-w$W; mkdir -p "$D"
pack() { tar czf "$OUT/nvshmem-w$W.tgz" -C "$D" .; }
ALGOS=${ALGOS:-hier,hier_2d,hier_tiers,ring,direct}
for c in ${STRESS-all_reduce reduce_scatter all_gather all_to_all}; do
  HC_TIMEOUT=${STRESS_S:-120} hc $W stress --backend cuda -c $c -t $T --inter-transport nvshmem \
    --sizes ${STRESS_SIZES:-8KiB,1000002,4MiB} --iters ${ITERS:-5} --modes eager,graph \
    --debug-timeout-ms 3000 --out $D/stress-$c.json > $D/stress-$c.log 2>&1
  echo "stress $c rc=$? ok $(grep -c '^ok' $D/stress-$c.log) FAIL $(grep -c '^FAIL' $D/stress-$c.log)"
  grep -m3 -i "error\|FAIL\|timed out" $D/stress-$c.log
done
pack
# the workloads' de-duplicated group_cast / group_reduce plans (hier: one inter-node copy per
# destination node), made here on the CPU: MagiAttention-style varlen causal attention and a MoE
# dispatch/combine; each plan file through the stress and the bench with every transport
if [ -n "$WORKLOADS" ]; then
  python3 -m hiercoll workload attention --cu-seqlens 0,3000,5000,8192,12000,16384 --chunk-size 512 \
    -t $T --row-bytes 1KiB --out $D/wl-attention > $D/wl-attention.log 2>&1
  python3 -m hiercoll workload moe --tokens 1024 --topk 4 --experts 32 -t $T --out $D/wl-moe > $D/wl-moe.log 2>&1
  for plan in $D/wl-attention/group_cast.*.json $D/wl-moe/group_*.json; do
    tag=$(basename $(dirname $plan))-$(basename $plan .json)
    HC_TIMEOUT=${STRESS_S:-120} hc $W stress $plan --backend cuda --inter-transport nvshmem --iters ${WL_ITERS:-20} \
      --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-$tag.json > $D/stress-$tag.log 2>&1
    echo "stress $tag rc=$? ok $(grep -c '^ok' $D/stress-$tag.log) FAIL $(grep -c '^FAIL' $D/stress-$tag.log)"
    for tr in ${TRANSPORTS:-nvshmem nccl peer}; do
      HC_TIMEOUT=${BENCH_S:-300} hc $W bench $plan --backend cuda --modes graph --zero-copy --peers none \
        --inter-transport $tr --out $D/bench-wl-$tr > $D/bench-$tag-$tr.log 2>&1
      echo "bench $tag $tr rc=$?"; grep "p50" $D/bench-$tag-$tr.log | head -4
    done
  done
  pack
fi
if [ -n "$TP" ]; then
  for v in "small 1,2,4,8,16,32,64,128,512 2000" "large 1024,4096,8192,16384 200"; do
    set -- $v
    HC_TIMEOUT=${TP_S:-200} hc $W stress --backend cuda -c all_reduce -t $T --algorithms hier --inter-transport nvshmem \
      --shapes $2 --iters $3 --modes eager,graph --out $D/stress-tp-$1.json > $D/stress-tp-$1.log 2>&1
    echo "stress tp $1 rc=$? ok $(grep -c '^ok' $D/stress-tp-$1.log) FAIL $(grep -c '^FAIL' $D/stress-tp-$1.log)"
  done
  pack
fi
for tr in ${TRANSPORTS:-nvshmem nccl peer}; do
  for c in ${BENCH-reduce_scatter all_reduce all_gather all_to_all}; do
    sizes=${SIZES:-1MiB,16MiB,256MiB}; [ $c = reduce_scatter ] && sizes=${RS_SIZES:-1MiB,4MiB,16MiB,64MiB,256MiB,1GiB}
    HC_TIMEOUT=${BENCH_S:-300} hc $W bench --backend cuda -c $c -t $T --algorithms $ALGOS --sizes $sizes \
      --modes graph --zero-copy --peers nccl --inter-transport $tr --out $D/bench-$tr > $D/bench-$tr-$c.log 2>&1
    echo "bench $tr $c rc=$?"; grep "p50" $D/bench-$tr-$c.log
  done
  pack
done
