#!/bin/bash
# Rank-identical all-reduce on ONE GPU (issue 14 s2): every rank of a plan in one process
# (`stress --one-gpu`), every all-reduce family, bf16, 4K..16M elements (8 KiB..32 MiB), eager
# and graph replay; each case prints ranks_identical=true|FALSE (every rank's output compared bit
# for bit after every call, plus two calls on wide inputs whose sums round in fp32: with the
# stress inputs, +-[0.25, 1), bf16 sums are exact in fp32 and any order gives the same bits).
# The 2M/4M-element sizes straddle what the issue saw (direct: eager from 1M elements, graph
# from 4M = the 8 MiB copy-engine threshold). A short fp32 pass follows: there a second summation
# order shows at any size. Everything lands in $OUT/rank_identical/ (logs, JSON, summary.txt).
# Budget: about 5 min on one H200.
source bench/gpu/env.sh
D=$OUT/rank_identical; mkdir -p "$D"
FAMILIES=ring,direct,two_shot,hier,hier_2d
BF16_SIZES=8KiB,128KiB,2MiB,4MiB,8MiB,16MiB,32MiB      # 4K, 64K, 1M, 2M, 4M, 8M, 16M elements
for t in h200x4 bench/gpu/topologies/h200-2node-x2.yaml; do
  one_gpu "$D" "bf16-$(basename "$t" .yaml)" "${LIMIT_S:-150}" -c all_reduce -t "$t" \
    --algorithms "$FAMILIES" --dtype bf16 --sizes "$BF16_SIZES" --iters "${ITERS:-10}" \
    --max-seconds "${CASE_S:-1}" --modes eager,graph
done
# hier_2d with the one-shot inter-node phase (inter=direct) has its own summation: every rail
# rank sums the node-partials itself. 4 nodes x 1 GPU, so it is four terms, not a + b == b + a
sed -e 's/^num_nodes: 2/num_nodes: 4/' -e 's/^gpus_per_node: 2/gpus_per_node: 1/' \
    -e 's/^name: .*/name: h200-4node-x1/' -e 's/^  num_nics: 2/  num_nics: 1/' \
    -e '/^  - 1$/d' bench/gpu/topologies/h200-2node-x2.yaml > "$D/h200-4node-x1.yaml"
python3 -m hiercoll plan -t "$D/h200-4node-x1.yaml" -c all_reduce -b 8KiB -a hier_2d \
  -p inter=direct -o "$D/hier2d_direct.json" > "$D/hier2d_direct.plan.log" 2>&1
one_gpu "$D" "bf16-hier2d-direct-4x1" "${LIMIT_S:-150}" "$D/hier2d_direct.json" --dtype bf16 \
  --sizes "$BF16_SIZES" --iters "${ITERS:-10}" --max-seconds "${CASE_S:-1}" --modes eager,graph
one_gpu "$D" "fp32-h200x4" "${LIMIT_S:-150}" -c all_reduce -t h200x4 --algorithms "$FAMILIES" \
  --dtype fp32 --sizes 4KiB,4MiB,16MiB --iters "${ITERS:-10}" --max-seconds "${CASE_S:-1}" \
  --modes eager,graph
grep -h "ranks_identical" "$D"/*.log | tee "$D/summary.txt"
echo "== cases: $(grep -c ranks_identical=true "$D/summary.txt") identical, $(grep -c ranks_identical=FALSE "$D/summary.txt") NOT identical"
