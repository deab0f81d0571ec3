#!/bin/bash
# scratch (never committed): the relaxed reader count. GPU tests beside the probe's compiles;
# the probe before (HEAD, acquire-release) and after (this tree), one process at a time; then
# the core bench at T = 1 on this tree.
out=$1; deadline=$2; mkdir -p $out; start=$(date +%s); ROOT=$PWD
left() { echo $(( deadline - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > $out/gpu.txt
probe() {  # tree name dtype sink
  ( cd $1 && PYTHONPATH=$(echo $PYTHONPATH | sed "s#$ROOT#$PWD#g") GDNGEN_CACHE_DIR=/tmp/gc3-$2 \
    timeout 200 python docs/perf/raw/h100-core-3/prologue_probe.py $3 1,4,8 1,512 32,64 ) \
    > $4 2> $4.err
  echo "probe $2 $3 rc=$? +$(( $(date +%s) - start ))s"
}
( GDNGEN_CACHE_DIR=/tmp/gc-tests timeout 300 python -m pytest -q -p no:cacheprovider -n 3 -rf \
    tests/gpu/test_conv_gpu.py > $out/conv-tests.log 2>&1
  echo "conv tests rc=$? +$(( $(date +%s) - start ))s"; tail -3 $out/conv-tests.log ) &
for d in bf16 fp32; do probe scratch/before before $d /tmp/w-b-$d & probe . after $d /tmp/w-a-$d & done
wait
for d in bf16 fp32; do probe scratch/before before $d $out/probe-before-$d.jsonl; probe . after $d $out/probe-after-$d.jsonl; done
for d in bf16 fp32; do
  GDNGEN_CACHE_DIR=/tmp/gc3-after timeout $(( $(left) / 2 )) python -m gdngen.bench.core --out $out/core-t1-$d \
    --batches 1,16,64,256,512 --tokens 1 --heads 32,64 --dtypes $d > $out/core-t1-$d.log 2>&1
  echo "core t1 $d rc=$? +$(( $(date +%s) - start ))s"
done
