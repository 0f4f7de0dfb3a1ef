#!/bin/bash
# Stress sweep of the cuda backend (issue 5, section 3): 13 M values x hidden 2880/4096 (bf16),
# every applicable algorithm plus the nccl row, eager and graph replay, fresh inputs each
# iteration. Usage: bash bench/gpu/stress.sh WORLD TOPOLOGY [COLLECTIVES]
#   bash bench/gpu/stress.sh 4 h200x4
#   bash bench/gpu/stress.sh 4 bench/gpu/topologies/h200-2node-x2.yaml
#   bash bench/gpu/stress.sh 2 bench/gpu/topologies/h200x2.yaml
source bench/gpu/env.sh
WORLD=${1:-4}; TOPO=${2:-h200x4}; COLLS=${3:-"all_reduce reduce_scatter all_gather all_to_all"}
SMALL="1,2,4,8,16,32,64,128,512"       # <= 4.7 MB at hidden 4096: 2000 iterations, numpy reference
LARGE="1024,4096,8192,16384"          # up to 134 MB: 200 iterations, NCCL as the reference
tag=$(basename "$TOPO" .yaml)
for c in $COLLS; do
  HC_TIMEOUT=${HC_TIMEOUT:-280} hc "$WORLD" stress --backend cuda -c "$c" -t "$TOPO" --shapes "$SMALL" \
    --iters "${ITERS_SMALL:-2000}" --modes eager,graph --out "$OUT/stress-$tag-w$WORLD-$c-small.json"
  HC_TIMEOUT=${HC_TIMEOUT:-280} hc "$WORLD" stress --backend cuda -c "$c" -t "$TOPO" --shapes "$LARGE" \
    --iters "${ITERS_LARGE:-200}" --modes eager,graph --out "$OUT/stress-$tag-w$WORLD-$c-large.json"
done
