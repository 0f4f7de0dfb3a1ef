#!/bin/bash
# One stress case of the NVSHMEM transport with a hang dump: after LIMIT seconds every Python
# thread's stack of every rank goes to the log (faulthandler on SIGABRT).
# C=reduce_scatter W=2 T=bench/gpu/topologies/h200-2node-x1.yaml bash bench/gpu/nvshmem_debug.sh
source bench/gpu/env.sh
export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_SYMMETRIC_SIZE=8G
export PYTHONFAULTHANDLER=1
W=${W:-2}; T=${T:-bench/gpu/topologies/h200-2node-x1.yaml}; C=${C:-reduce_scatter}
mkdir -p $OUT/debug
torchrun --nproc-per-node $W --master-port $((29500 + RANDOM % 1000)) -m hiercoll stress --backend cuda \
  -c $C -t $T --inter-transport nvshmem --sizes ${SIZES:-8KiB} --iters 3 --modes ${MODES:-eager} \
  ${ALGOS:+--algorithms $ALGOS} --debug-timeout-ms 3000 --out $OUT/debug/$C.json > $OUT/debug/$C.log 2>&1 &
pid=$!
for i in $(seq ${LIMIT:-45}); do kill -0 $pid 2>/dev/null || break; sleep 1; done
if kill -0 $pid 2>/dev/null; then
  echo "HUNG after ${LIMIT:-45} s: dumping"; nvidia-smi --query-gpu=utilization.gpu --format=csv
  pkill -ABRT -f "hiercoll stress" ; sleep 3; pkill -9 -f "hiercoll stress"
fi
wait $pid; echo "rc=$?"
grep -v "Warning\|warn(" $OUT/debug/$C.log | grep -B2 -A14 "most recent call first\|^ok\|^FAIL\|error" | head -${LINES_OUT:-80}
