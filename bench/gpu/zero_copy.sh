#!/bin/bash
# Zero-copy calls on Communicator.empty tensors (issue 26 item 3), and the TP model (item 4).
# PART=one: the one-GPU test of plans rebased onto callers' tensors (every rank on GPU 0).
# PART=multi (W GPUs): the Communicator's GPU test (comm.empty cases included), the
# Communicator-overhead bench with its comm.empty column, the all_reduce stress (the rebuilt
# prepare path), and tp_model.sh. Logs and results under $OUT.
source bench/gpu/env.sh
W=${W:-$(nvidia-smi -L | wc -l)}
if [ "${PART:-multi}" = one ]; then
  timeout -k 5 "${ONE_S:-400}" python3 -m pytest -p no:cacheprovider -m gpu -x -q \
    tests/test_exec_one_gpu.py -k rebased > "$OUT/one_gpu_rebased.log" 2>&1
  echo "== one-GPU rebased rc=$?"; tail -5 "$OUT/one_gpu_rebased.log"
  exit 0
fi
timeout -k 5 "${API_S:-200}" python3 -m pytest -p no:cacheprovider -m gpu -x -q \
  tests/test_torch_api.py -k gpu_communicator > "$OUT/comm_gpu_test_w$W.log" 2>&1
echo "== Communicator GPU test w$W rc=$?"; tail -5 "$OUT/comm_gpu_test_w$W.log"
timeout -k 5 "${COMM_S:-150}" torchrun --nproc-per-node "$W" --master-port $((29500 + RANDOM % 1000)) \
  bench/comm_overhead.py --topology "${T:-auto}" --sizes "${SIZES:-8KiB,64KiB,256KiB,1MiB,4MiB,16MiB}" \
  --out "$OUT/comm" > "$OUT/comm_w$W.log" 2>&1
echo "== comm_overhead w$W rc=$?"; cat "$OUT/comm/comm_overhead.md" 2>/dev/null || tail -20 "$OUT/comm_w$W.log"
HC_TIMEOUT=${STRESS_S:-120} hc "$W" stress --backend cuda -c all_reduce -t "${T:-auto}" \
  --sizes 8KiB,1000008,16MiB --iters 30 --modes eager,graph --debug-timeout-ms 5000 \
  --out "$OUT/stress_ar_w$W.json" > "$OUT/stress_ar_w$W.log" 2>&1
echo "== stress all_reduce w$W rc=$? $(grep -c '^ok' "$OUT/stress_ar_w$W.log") ok $(grep -c '^FAIL' "$OUT/stress_ar_w$W.log") FAIL"
if [ -n "$TPMODEL" ]; then bash bench/gpu/tp_model.sh; fi
