#!/bin/bash
# First check of the cuda backend's kernels on ONE GPU (every rank in one process, --one-gpu):
# every collective x applicable algorithm on 1x4, 2x2 and 1x2 topologies, 3 sizes (one CTA step,
# unaligned, copy-engine sized), eager and graph. (Its first run, with channel streams in graph
# mode, found the deadlock that made graph mode single-stream.) Usage: ITERS=5 bash ...
source bench/gpu/env.sh
D=$OUT/smoke; mkdir -p "$D"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
for t in h200x4 bench/gpu/topologies/h200-2node-x2.yaml bench/gpu/topologies/h200x2.yaml; do
  for c in all_reduce reduce_scatter all_gather all_to_all; do
    one_gpu "$D" "smoke-$(basename "$t" .yaml)-$c" "${HC_TIMEOUT:-150}" -c "$c" -t "$t" \
      --sizes 8KiB,1000008,16MiB --iters "${ITERS:-5}" --modes eager,graph
  done
done
tar czf "$OUT/smoke.tgz" -C "$OUT" smoke && rm -rf "$D"
