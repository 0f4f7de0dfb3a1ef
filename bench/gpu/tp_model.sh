#!/bin/bash
# The tensor-parallel transformer of bench/tp_model.py on W GPUs (issue 26 item 4): 100 steps of
# fresh inputs, outputs of hiercoll's fused path and of patch() on the unedited model against the
# NCCL path, and time per forward (graph and eager). Usage: W=4 bash bench/gpu/tp_model.sh
source bench/gpu/env.sh
W=${W:-$(nvidia-smi -L | wc -l)}
timeout -k 5 "${TP_S:-300}" torchrun --nproc-per-node "$W" --master-port $((29500 + RANDOM % 1000)) \
  bench/tp_model.py --out "$OUT/tp_model" --topology "${T:-auto}" ${TP_ARGS} > "$OUT/tp_model_w$W.log" 2>&1
echo "== tp_model w$W rc=$?"; cat "$OUT/tp_model/tp_model_nccl_tp$W.md" 2>/dev/null || tail -5 "$OUT/tp_model_w$W.log"
