#!/bin/bash
# One 4-GPU device call of two checks: the fused LL form with and without row padding in its
# LL area (HIERCOLL_FUSED_LL_PAD 0 / 32; hidden 4096, M = 1..32: every path of bench/fused_norm.py
# --group), and issue 27's --inter-transport nccl on the 2-nodes-x-2 mapping in eager mode (a stress,
# then the reduce-scatter bench with NCCL's warnings on). Usage: bash bench/gpu/ll_pad_nccl.sh
# The padding knob (HIERCOLL_FUSED_LL_PAD) was removed after this A/B (padding lost): the first
# half reproduces at e6db7cc, where the committed results came from; later commits ignore it.
source bench/gpu/env.sh
for pad in 0 32; do
  HIERCOLL_FUSED_LL_PAD=$pad timeout -k 5 110 torchrun --nproc-per-node 4 --master-port $((29500 + RANDOM % 1000)) bench/fused_norm.py --group --reps 30 --shapes 1,2,4,8,16,32 --hidden 4096 --out $OUT/ll-pad$pad > $OUT/ll-pad$pad.log 2>&1
  echo "== pad $pad rc=$?"; grep -o '"rows": [0-9]*\|"stage3": {"p50": [0-9.]*\|"stage1": {"p50": [0-9.]*\|"torch-one-shot_alone": {"p50": [0-9.]*' $OUT/ll-pad$pad.log | paste -sd' ' | sed 's/"rows"/\n"rows"/g'
done
T=bench/gpu/topologies/h200-2node-x2.yaml
NCCL_DEBUG=WARN HC_TIMEOUT=100 hc 4 stress --backend cuda -c reduce_scatter -t $T --algorithms hier --inter-transport nccl --sizes 1MiB --iters 5 --modes eager --debug-timeout-ms 5000 > $OUT/nccl-stress.log 2>&1
echo "== nccl stress rc=$?"; grep -c "^ok" $OUT/nccl-stress.log; tail -5 $OUT/nccl-stress.log
NCCL_DEBUG=WARN HC_TIMEOUT=150 hc 4 bench --backend cuda -c reduce_scatter -t $T --algorithms hier,hier_2d --sizes 1MiB,16MiB,256MiB,1GiB --modes eager --zero-copy --peers nccl --inter-transport nccl --out $OUT/bench-nccl > $OUT/nccl-bench.log 2>&1
echo "== nccl bench rc=$?"; grep "p50" $OUT/nccl-bench.log | head -20; tail -3 $OUT/nccl-bench.log
