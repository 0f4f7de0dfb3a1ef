#!/bin/bash
# One multi-GPU device call for the LL lowering (executor/cuda/ll.py): the stress of every
# collective x family at small sizes, the TP-shape stress of the direct all-reduce (2000
# iterations up to 4.7 MB, 200 above), issue 25's comparison table at 8 KiB..1 MiB with the peers,
# and LL against simple on the direct all-reduce / reduce-scatter per size (where auto's
# threshold comes from); with COMM=1 the Communicator's overhead (bench/comm_overhead.py), with
# TPMODEL=1 the TP transformer (tp_model.sh); SKIP_STRESS, SKIP_TP, SKIP_SWEEP drop parts.
# Usage: W=2 T=bench/gpu/topologies/h200x2.yaml bash bench/gpu/ll_run.sh
# Results: $OUT/ll-wW.tgz
source bench/gpu/env.sh
set -o pipefail
W=${W:-2}; T=${T:-bench/gpu/topologies/h200x2.yaml}
D=/tmp/ll-w$W; mkdir -p "$D"
pack() { tar czf "$OUT/ll-w$W.tgz" -C "$D" .; }
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())" | tee "$D/versions.txt"
if [ -z "$SKIP_STRESS" ]; then
for c in all_reduce reduce_scatter all_gather all_to_all; do
  HC_TIMEOUT=${STRESS_S:-100} hc $W stress --backend cuda -c $c -t $T --sizes 8KiB,64KiB,256KiB,1000002 \
    --iters 10 --modes eager,graph --debug-timeout-ms 3000 --out $D/stress-$c.json > $D/stress-$c.log 2>&1
  echo "$c rc=$? ok $(grep -c '^ok' $D/stress-$c.log) FAIL $(grep -c '^FAIL' $D/stress-$c.log)"
done
for part in "1,2,4,8,16,32,64,128,512 ${TP_ITERS:-2000}" "1024,4096,8192,16384 200"; do
  [ -n "$SKIP_TP" ] && break
  set -- $part
  HC_TIMEOUT=${TP_S:-150} hc $W stress --backend cuda -c all_reduce -t $T --algorithms direct --shapes $1 \
    --iters $2 --modes eager,graph --out $D/tp-$2.json > $D/tp-$2.log 2>&1
  echo "tp shapes $1 x $2: rc=$? ok $(grep -c '^ok' $D/tp-$2.log) FAIL $(grep -c '^FAIL' $D/tp-$2.log)"
done
pack
fi
for proto in ${SKIP_SWEEP:-ll simple}; do
  [ -n "$SKIP_SWEEP" ] && break
  HC_TIMEOUT=${SWEEP_S:-120} hc $W bench --backend cuda -c ${SWEEP_COLL:-all_reduce} -t $T --algorithms direct \
    --sizes ${SWEEP_SIZES:-8KiB,32KiB,64KiB,128KiB,256KiB,512KiB,1MiB,2MiB} --modes graph --zero-copy \
    --peers none --protocol $proto --out $D/sweep-$proto > $D/sweep-$proto.log 2>&1
  echo "sweep $proto rc=$?"; grep -h "graph" $D/sweep-$proto.log | head -12
done
pack
HC_TIMEOUT=${HCT:-110} bash bench/gpu/compare.sh $W $T ${SIZES:-8KiB,64KiB,256KiB,1MiB} \
  "${COLLS:-all_reduce reduce_scatter all_gather all_to_all}" > $D/compare.log 2>&1
cp $OUT/compare-w$W.tgz $D/ 2>/dev/null; rm -f $OUT/compare-w$W.tgz
grep graph $D/compare.log | head -80
pack
if [ -n "$COMM" ]; then   # the Communicator's cost on top of its plan (issue 26 item 3)
  timeout -k 5 ${COMM_S:-120} torchrun --nproc-per-node $W --master-port $((29500 + RANDOM % 1000)) \
    bench/comm_overhead.py --topology $T --out $D/comm > $D/comm.log 2>&1
  echo "comm rc=$?"; cat $D/comm/comm_overhead.md 2>/dev/null || tail -5 $D/comm.log
  pack
fi
if [ -n "$TPMODEL" ]; then   # the TP transformer (issue 26 item 4)
  OUT=$D T=$T bash bench/gpu/tp_model.sh
  pack
fi
