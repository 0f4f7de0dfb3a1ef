#!/bin/bash
# Issue 25's 4-GPU mid band in one device call: the simple protocol at the sizes where `--protocol
# auto` takes LL on 4 GPUs (every op <= 256 KiB up to a 1 MiB buffer), then compare.sh's table
# (auto, every family, the peers) over the same band, then the TP transformer at TP 4.
# W=4 T=h200x4 bash bench/gpu/w4_mid.sh   (results: $OUT/w4-mid.tgz; a cut call keeps what ran)
source bench/gpu/env.sh
W=${W:-4}; T=${T:-h200x4}
D=/tmp/w4-mid; mkdir -p "$D"
pack() { tar czf "$OUT/w4-mid.tgz" -C "$D" .; }
nvidia-smi -L | tee "$D/gpus.txt"
COLLS=${COLLS:-all_reduce,reduce_scatter,all_gather,all_to_all}
HC_TIMEOUT=${SWEEP_S:-170} hc $W bench --backend cuda -c $COLLS -t $T --sizes ${SWEEP_SIZES:-256KiB,512KiB,1MiB,2MiB} \
  --modes graph --zero-copy --peers none --protocol simple --out $D/simple > $D/simple.log 2>&1
echo "simple sweep rc=$?"; pack
OUT=$D MODES=graph HC_TIMEOUT=${BENCH_S:-75} bash bench/gpu/compare.sh $W $T ${SIZES:-256KiB,512KiB,1MiB,2MiB,4MiB,16MiB} > $D/compare.log 2>&1
echo "compare rc=$?"; rm -f $D/compare-w$W.tgz; mv /tmp/compare-w$W $D/compare; pack
if [ -n "$TPMODEL" ]; then OUT=$D W=$W TP_S=${TP_S:-120} bash bench/gpu/tp_model.sh; pack; fi
