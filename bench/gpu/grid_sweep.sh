#!/bin/bash
# Launch shapes of the row kernel over issue 25's mid band: per config (step elements and warps,
# the sweep_knob environment overrides read at import; most CTAs, --max-ctas <= 132) one `hiercoll bench` of
# all_reduce and reduce_scatter, graph mode, zero-copy; the first config also times the peers.
# W=2 bash bench/gpu/grid_sweep.sh   ($OUT/grid_sweep.tgz: a directory per config, and a table)
source bench/gpu/env.sh
W=${W:-2}; T=${T:-bench/gpu/topologies/h200x2.yaml}
SIZES=${SIZES:-256KiB,1MiB,2MiB,4MiB,16MiB}
CONFIGS=${CONFIGS:-"4096:8:120 4096:8:132 8192:16:132 8192:8:132 16384:16:132"}   # most CTAs <= 132
peers=all
for cfg in $CONFIGS; do
  IFS=: read step warps ctas <<< "$cfg"
  dir=/tmp/grid/s${step}-w${warps}-c${ctas}; mkdir -p $dir
  HIERCOLL_STEP_ELEMENTS=$step HIERCOLL_NUM_WARPS=$warps \
    HC_TIMEOUT=${CFG_S:-100} hc $W bench --backend cuda -c all_reduce,reduce_scatter -t $T \
    --sizes $SIZES --modes graph --zero-copy --peers $peers --max-ctas $ctas --algorithms ${ALGOS:-direct,two_shot} \
    --out $dir > $dir/log 2>&1
  echo "== $cfg rc=$?"; grep -i "error\|timed out" $dir/log | head -3
  peers=none
  tar -czf $OUT/grid_sweep.tgz -C /tmp/grid .
done
python3 - <<'PY'
import json, pathlib
rows = {}
for f in sorted(pathlib.Path("/tmp/grid").glob("*/*.json")):
    try:
        d = json.loads(f.read_text())
    except Exception:
        continue
    for r in d.get("rows", []):
        if r.get("mode") != "graph":
            continue
        key = (r["collective"], r["nbytes"], r["algorithm"])
        rows.setdefault(key, {})[f.parent.name] = r.get("p50_us")
cfgs = sorted({c for v in rows.values() for c in v})
print("collective bytes algorithm | " + " | ".join(cfgs))
for k in sorted(rows, key=lambda k: (str(k[0]), k[1] or 0, str(k[2]))):
    print(*k, "|", " | ".join(f"{rows[k][c]:.2f}" if c in rows[k] else "-" for c in cfgs))
PY
