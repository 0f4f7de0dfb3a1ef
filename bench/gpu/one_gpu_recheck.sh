#!/bin/bash
# After the house refactors (call protocol, KernelState, event-timing loop): the one-GPU bench,
# profile and stress paths once more on real kernels. Short; logs only.
source bench/gpu/env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
timeout -k 5 200 python3 -m hiercoll bench --one-gpu --backend cuda -c all_reduce -t one-gpu-h200x4 \
  --algorithms ring,direct,two_shot --sizes 64KiB,16MiB --modes eager,graph --out "$OUT/bench" 2>&1 | tail -8
python3 -m hiercoll plan -t one-gpu-h200x4 -c reduce_scatter -b 4MiB -a ring -o "$OUT/p.json" > /dev/null
timeout -k 5 120 python3 -m hiercoll run "$OUT/p.json" --backend cuda --one-gpu --check --iters 20 \
  --profile "$OUT/tl.json" 2>&1 | tail -2
python3 -m hiercoll compare --timeline "$OUT/tl.json" -t one-gpu-h200x4 2>&1 | head -4
for c in all_reduce all_gather all_to_all; do
  timeout -k 5 120 python3 -m hiercoll stress --one-gpu --backend cuda -c $c -t h200x4 \
    --sizes 8KiB,1000008,16MiB --iters 20 --modes eager,graph --debug-timeout-ms 5000 2>&1 | grep -c "^ok" | sed "s/^/$c ok cases: /"
done
