#!/bin/bash
# Eager host cost on one H200 (bench/host_launch.py --gpu: the JIT's dispatch vs bound launches,
# the other per-op host costs, whole eager calls with and without bound launches), then the
# one-GPU calibration bench and its smoke (bench/gpu/one_gpu_calibration.sh) on bound launches.
#   bash bench/gpu/one_gpu_host.sh   ($OUT: host/ + the calibration script's results.tgz)
source bench/gpu/env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
timeout -k 5 "${HOST_TIMEOUT:-90}" python3 bench/host_launch.py --gpu --out "$OUT/host" -n 500 \
  --iters 30 > "$OUT/host.log" 2>&1
echo "== host_launch rc=$?"; tail -16 "$OUT/host.log"
HC_TIMEOUT=${HC_TIMEOUT:-120} bash bench/gpu/one_gpu_calibration.sh
