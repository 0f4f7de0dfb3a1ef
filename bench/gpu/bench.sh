#!/bin/bash
# Benchmarks against NCCL (issue 5, section 4): busbw per size, eager and graph, one JSON/MD/PNG
# per collective. Usage: bash bench/gpu/bench.sh WORLD TOPOLOGY [COLLECTIVES] [SIZES]
source bench/gpu/env.sh
WORLD=${1:-4}; TOPO=${2:-h200x4}; COLLS=${3:-"all_reduce reduce_scatter all_gather all_to_all"}
SIZES=${4:-8KiB:1GiB:4}
for c in $COLLS; do
  HC_TIMEOUT=${HC_TIMEOUT:-280} hc "$WORLD" bench --backend cuda -c "$c" -t "$TOPO" --sizes "$SIZES" \
    --modes eager,graph ${ZERO_COPY:+--zero-copy} --out "$OUT/bench-w$WORLD"
done
