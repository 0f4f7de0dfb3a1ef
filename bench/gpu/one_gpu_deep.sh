#!/bin/bash
# 2000 iterations per case on ONE GPU (every rank in one process): the TP all-reduce shapes
# (M = 1 and 1024 at hidden 4096, bf16) for every algorithm, flat 4 ranks and 2 nodes x 2,
# eager and graph; reduce-scatter in graph mode. Results land in $OUT/one_gpu_deep.tgz.
source bench/gpu/env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
D=$OUT/one_gpu_deep; mkdir -p "$D"
st() {  # st TAG SECONDS ARGS...
  local tag=$1 limit=$2; shift 2
  timeout -k 5 "$limit" python3 -m hiercoll stress --one-gpu --backend cuda --debug-timeout-ms 5000 \
    --iters 2000 --out "$D/deep-$tag.json" "$@" > "$D/deep-$tag.log" 2>&1
  echo "== $tag rc=$? $(grep -c '^ok' "$D/deep-$tag.log") ok $(grep -c '^FAIL' "$D/deep-$tag.log") FAIL"
}
st h200x4-all_reduce 150 -c all_reduce -t h200x4 --shapes 1,1024 --hidden 4096 --modes graph,eager
st h200-2node-x2-all_reduce 150 -c all_reduce -t bench/gpu/topologies/h200-2node-x2.yaml \
  --shapes 1,1024 --hidden 4096 --modes graph,eager
st h200x4-reduce_scatter 60 -c reduce_scatter -t h200x4 --shapes 1,1024 --hidden 4096 --modes graph
tar czf "$OUT/one_gpu_deep.tgz" -C "$OUT" one_gpu_deep && rm -rf "$D"
