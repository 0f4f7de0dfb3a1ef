#!/bin/bash
# This lowering against itself with one knob turned back, in one run (graph, zero-copy, every
# collective and family): the LL unpack rule (--ll-unpack-threshold 256KiB: auto as before it) and
# the channel split (--no-split-channels), between two runs of the defaults (the spread between
# those is the run's noise). W=2 bash bench/gpu/ab_knobs.sh   (results: $OUT/ab-knobs.tgz)
source bench/gpu/env.sh
W=${W:-2}; T=${T:-bench/gpu/topologies/h200x2.yaml}
D=/tmp/ab-knobs; mkdir -p $D
pack() { tar czf "$OUT/ab-knobs.tgz" -C "$D" .; }
nvidia-smi -L > $D/gpus.txt
run() {  # run TAG PEERS FLAGS...
  local tag=$1 peers=$2; shift 2
  HC_TIMEOUT=${AB_S:-70} hc $W bench --backend cuda -c all_reduce,reduce_scatter,all_gather,all_to_all -t $T \
    --sizes ${SIZES:-8KiB,64KiB,256KiB,1MiB,4MiB,16MiB} --modes graph --zero-copy --peers $peers "$@" \
    --out $D/$tag > $D/$tag.log 2>&1
  echo "== $tag rc=$?"; pack
}
run new-1 nccl
run old-unpack none --ll-unpack-threshold 256KiB
run no-split none --no-split-channels
run new-2 none
