#!/bin/bash
# scratch (never committed): GPU tests of the key-head cluster beside the prologue probe's
# compiles, then the probe before (HEAD's tree in scratch/before) and after (this tree), one
# process at a time.
out=$1; mkdir -p $out; start=$(date +%s); ROOT=$PWD
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > $out/gpu.txt
probe() {  # tree name dtype sink
  ( cd $1 && PYTHONPATH=$(echo $PYTHONPATH | sed "s#$ROOT#$PWD#g") GDNGEN_CACHE_DIR=/tmp/gc-$2 \
    timeout 200 python docs/perf/raw/h100-core-3/prologue_probe.py $3 1 1,16,64,512 32,64 ) \
    > $4 2> $4.err
  echo "probe $2 $3 rc=$? +$(( $(date +%s) - start ))s"
}
( GDNGEN_CACHE_DIR=/tmp/gc-tests timeout 400 python -m pytest -q -p no:cacheprovider -n 3 -rf \
    tests/gpu/test_conv_gpu.py > $out/conv-tests.log 2>&1
  echo "conv tests rc=$? +$(( $(date +%s) - start ))s"; tail -3 $out/conv-tests.log ) &
for d in bf16 fp32; do probe scratch/before before $d /tmp/warm-b-$d & probe . after $d /tmp/warm-a-$d & done
wait
for d in bf16 fp32; do probe scratch/before before $d $out/probe-before-$d.jsonl; probe . after $d $out/probe-after-$d.jsonl; done
