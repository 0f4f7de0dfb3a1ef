#!/bin/bash
# 2000 iterations per case on ONE GPU (every rank in one process): the TP all-reduce shapes
# (M = 1 and 1024 at hidden 4096, bf16) for every algorithm, flat 4 ranks and 2 nodes x 2,
# eager and graph; reduce-scatter in graph mode. Results land in $OUT/one_gpu_deep.tgz.
source bench/gpu/env.sh
D=$OUT/one_gpu_deep; mkdir -p "$D"
one_gpu "$D" deep-h200x4-all_reduce 150 -c all_reduce -t h200x4 --shapes 1,1024 --hidden 4096 \
  --iters 2000 --modes graph,eager
one_gpu "$D" deep-h200-2node-x2-all_reduce 150 -c all_reduce \
  -t bench/gpu/topologies/h200-2node-x2.yaml --shapes 1,1024 --hidden 4096 --iters 2000 --modes graph,eager
one_gpu "$D" deep-h200x4-reduce_scatter 60 -c reduce_scatter -t h200x4 --shapes 1,1024 --hidden 4096 \
  --iters 2000 --modes graph
tar czf "$OUT/one_gpu_deep.tgz" -C "$OUT" one_gpu_deep && rm -rf "$D"
