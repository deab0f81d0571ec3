#!/bin/bash
# scratch (never committed): the reader count's parts, HEAD's tree (scratch/before) with
# GDN_ABLATE modes; compiles in parallel, then timings one process at a time.
out=$1; mkdir -p $out; start=$(date +%s); ROOT=$PWD
probe() {  # mode dtype sink
  ( cd scratch/before && PYTHONPATH=$(echo $PYTHONPATH | sed "s#$ROOT#$PWD#g") GDN_ABLATE=${1#base} \
    GDNGEN_CACHE_DIR=/tmp/gcx-$1 timeout 200 python docs/perf/raw/h100-core-3/prologue_probe.py $2 1 1,16,64,512 32,64 ) \
    > $3 2> $3.err
  echo "probe $1 $2 rc=$? +$(( $(date +%s) - start ))s"
}
modes=(base relaxed nostore relaxed,nostore)
for d in bf16 fp32; do for m in "${modes[@]}"; do probe $m $d /tmp/warm-$m-$d & done; done
wait
for d in bf16 fp32; do for m in "${modes[@]}"; do probe $m $d $out/abl-$m-$d.jsonl; done; done
