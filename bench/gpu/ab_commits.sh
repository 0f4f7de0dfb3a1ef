#!/bin/bash
# A/B of the row kernel between this tree and an older commit (OLD) in one run, alternating:
# large reduce-heavy rows at a fixed grid, so only the code differs (issue 25: is a slowdown the
# code or the machine?). W=2 OLD=6da5748 bash bench/gpu/ab_commits.sh   ($OUT/ab-*.md)
source bench/gpu/env.sh
W=${W:-2}; REPO=$PWD; OLD=${OLD:-6da5748}
git worktree add -f /tmp/old $OLD > /dev/null 2>&1 || { echo "no commit $OLD here"; exit 2; }
for v in ${ORDER:-new old new old}; do
  if [ $v = old ]; then cd /tmp/old; else cd $REPO; fi
  export PYTHONPATH=/tmp/site:$PWD
  rm -rf /tmp/ab-run; HC_TIMEOUT=${AB_S:-100} hc $W bench --backend cuda -c all_reduce,reduce_scatter \
    -t $REPO/bench/gpu/topologies/h200x2.yaml --sizes ${SIZES:-256MiB,1GiB} --modes graph --zero-copy \
    --peers none --ctas ${CTAS:-132} --algorithms ${ALGOS:-direct,two_shot} --out /tmp/ab-run > /tmp/ab-$v.log 2>&1
  echo "== $v rc=$?"; grep -h " graph " /tmp/ab-run/*.md | awk -F'|' '{print $2,$4,$5}' | tee -a $OUT/ab-$v.md
done
