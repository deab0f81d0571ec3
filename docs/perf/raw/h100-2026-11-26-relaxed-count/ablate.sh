#!/bin/bash
# scratch: the conv prologue's ablation (never committed). From the repo root, after setup.sh.
out=$1; mkdir -p $out; start=$(date +%s)
cp scratch/conv_ablate.py gdngen/device/conv.py
modes=(base share nocount share,nocount)
# phase 1: compile every kernel of each mode into its own disk cache, in parallel
for m in "${modes[@]}"; do for d in bf16 fp32; do
  ( GDN_ABLATE=${m#base} GDNGEN_CACHE_DIR=/tmp/gc-$m timeout 300 python docs/perf/raw/h100-core-3/prologue_probe.py $d 1 1,16,512 32,64 > $out/warm-$m-$d.log 2>&1 ) &
done; done
wait
echo "compiled +$(( $(date +%s) - start ))s"
# phase 2: time, one process at a time, modes interleaved per dtype
for d in bf16 fp32; do for m in "${modes[@]}"; do
  GDN_ABLATE=${m#base} GDNGEN_CACHE_DIR=/tmp/gc-$m timeout 120 python docs/perf/raw/h100-core-3/prologue_probe.py $d 1 1,16,512 32,64 > $out/time-$m-$d.jsonl 2>$out/time-$m-$d.err
  echo "$m $d rc=$? +$(( $(date +%s) - start ))s"
done; done
git checkout gdngen/device/conv.py
