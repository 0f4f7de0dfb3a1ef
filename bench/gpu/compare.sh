#!/bin/bash
# The comparison table of issue 25 in one device call: every collective x sizes x every applicable
# family (+ the nccl library call) x graph and eager, zero-copy, with the peers' rows (NCCL as
# nccl-tests calls it, torch's symmetric-memory one/two-shot all-reduce and reduce-scatter)
# timed by the same harness in the same run. Graph mode: a graph of 10 calls, time per call.
# Usage: [MODES=graph] bash bench/gpu/compare.sh WORLD TOPOLOGY [SIZES] [COLLECTIVES]
# Results: $OUT/compare-wWORLD.tgz (JSON/MD/PNG per collective) and $OUT/compare-wWORLD.log.
source bench/gpu/env.sh
WORLD=${1:-4}; TOPO=${2:-h200x4}; SIZES=${3:-8KiB:1GiB:2}
COLLS=${4:-"all_reduce reduce_scatter all_gather all_to_all"}
DIR=/tmp/compare-w$WORLD
mkdir -p "$DIR"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
for c in $COLLS; do
  HC_TIMEOUT=${HC_TIMEOUT:-540} hc "$WORLD" bench --backend cuda -c "$c" -t "$TOPO" --sizes "$SIZES" \
    --modes ${MODES:-graph,eager} --zero-copy --peers all ${ALGOS:+--algorithms $ALGOS} --out "$DIR" 2>&1 \
    | grep -v "^W1\|OMP_NUM\|^\*\*\*\*"
  tar -czf "$OUT/compare-w$WORLD.tgz" -C "$DIR" .    # after each: a later timeout keeps these
done
