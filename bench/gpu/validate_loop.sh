#!/bin/bash
# After an executor change, the loop in one device call (issue 28 item 3): re-bench every
# collective x family (+ nccl and the peers) on this machine (compare.sh), re-calibrate the
# simulator on that run, and measure the regret of the simulator's pick on it, with the shipped
# costs and with the costs just fitted. Usage: W=4 T=h200x4 bash bench/gpu/validate_loop.sh
# Results: $OUT/compare-wW.tgz, $OUT/calibrated-wW.yaml (+ .md), $OUT/regret-wW-{shipped,fitted}/
source bench/gpu/env.sh
W=${W:-4}; T=${T:-h200x4}
HC_TIMEOUT=${HCT:-300} bash bench/gpu/compare.sh "$W" "$T" "${SIZES:-8KiB,64KiB,256KiB,1MiB,16MiB,256MiB}" \
  > "$OUT/compare-w$W.log" 2>&1
D=/tmp/compare-w$W
ls "$D"/*.json > /dev/null 2>&1 || { echo "no bench JSON"; tail -20 "$OUT/compare-w$W.log"; exit 1; }
# calibrate uses the host's CPUs (--jobs: its default); --fix: a per-op cap the fit otherwise bends into a stand-in for link efficiency (docs/calibration.md)
FIX=${FIX:-costs.sm_op_gbps,costs.ce_op_gbps,costs.ce_concurrent_gbps,costs.ce_launch_us}
timeout -k 5 "${CAL_S:-300}" python3 -m hiercoll calibrate -t "$T" "$D"/*.json --folds 5 --fix "$FIX" \
  -o "$OUT/calibrated-w$W.yaml" --md "$OUT/calibrated-w$W.md" > "$OUT/calibrate-w$W.log" 2>&1
echo "== calibrate rc=$?"; grep -i "held out\|fold" "$OUT/calibrate-w$W.log" | head -8
for costs in shipped fitted; do
  topo=$T; [ $costs = fitted ] && topo=$OUT/calibrated-w$W.yaml
  HIERCOLL_NO_CACHE=1 timeout -k 5 120 python3 -m hiercoll autopick -t "$topo" --validate "$D"/*.json \
    --out "$OUT/regret-w$W-$costs" 2>&1 | head -1
done
