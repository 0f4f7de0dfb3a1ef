#!/bin/bash
# Where a mid-size call's time goes (issue 25's 256 KiB-16 MiB band on 2 GPUs): in-kernel stamps
# (trace_small.py, HIERCOLL_KERNEL_TRACE=1) and the same cases untraced, each plan at the
# lowering's grid and at the CTA counts of CTAS, torch's and NCCL's kernels in the same group.
# W=2 bash bench/gpu/mid_trace.sh   (results under $OUT/mid_trace-*.json)
source bench/gpu/env.sh
W=${W:-2}
CTAS=${CTAS:-auto,32,64,132}
probe() {  # probe TAG TRACE KIND SIZES ALGOS
  local tag=$1 trace=$2 kind=$3 sizes=$4 algos=$5
  mkdir -p /tmp/mt-$tag
  HIERCOLL_KERNEL_TRACE=$trace timeout -k 5 ${PROBE_S:-120} torchrun --nproc-per-node $W \
    --master-port $((29500 + RANDOM % 1000)) bench/gpu/trace_small.py --out /tmp/mt-$tag \
    --kind $kind --sizes $sizes --algorithms $algos --ctas $CTAS > /tmp/mt-$tag.log 2>&1
  echo "== $tag rc=$?"
  cp /tmp/mt-$tag/trace_small.json $OUT/mid_trace-$tag.json 2>/dev/null
  grep '"rank": 0' /tmp/mt-$tag.log | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["case"], r["per_call_us"], r.get("kernel_us", ""), r.get("gap_us", ""),
          " | ".join("/".join(str(v) for v in row.values()) for row in r.get("rows", [])[:8]))'
  grep -i "error\|Traceback" /tmp/mt-$tag.log | head -5
}
probe ar-plain 0 all_reduce ${AR_SIZES:-1048576,4194304} ${AR_ALGOS:-direct,two_shot}
probe rs-plain 0 reduce_scatter ${RS_SIZES:-2097152} ${RS_ALGOS:-direct}
CTAS=auto probe ar-trace 1 all_reduce ${AR_SIZES:-1048576,4194304} ${AR_ALGOS:-direct,two_shot}
CTAS=auto probe rs-trace 1 reduce_scatter ${RS_SIZES:-2097152} ${RS_ALGOS:-direct}
