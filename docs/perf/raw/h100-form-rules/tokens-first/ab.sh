#!/bin/bash
# tokens-first.diff (this tree) against main (scratch/s34/head.tar.xz: `git archive HEAD gdngen generated | xz`),
# side by side on GPU 0;
# the GPU tests of this tree on GPU 1 (GPU 0 on a one-GPU machine, after the timing's compiles).
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
gpus=$(nvidia-smi -L | wc -l); xg=$(( gpus > 1 ? 1 : 0 ))
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-packed/packed_forms.py
rm -rf /tmp/t-old /tmp/t-new && mkdir -p /tmp/t-old /tmp/t-new
cp -r gdngen generated docs /tmp/t-new/ && cp -r docs /tmp/t-old/ && tar -xJf scratch/s34/head.tar.xz -C /tmp/t-old
( export CUDA_VISIBLE_DEVICES=$xg GDNGEN_CACHE_DIR=/tmp/gc-tests
  timeout $(left) python -m pytest -q -p no:cacheprovider -n 4 -rf tests/gpu/test_engine_forms_gpu.py \
    tests/gpu/test_conv_gpu.py tests/gpu/test_gated_norm_gpu.py tests/gpu/test_call_gpu.py > "$res/tests.log" 2>&1
  step "tests rc=$? $(tail -n 1 "$res/tests.log")"
  timeout $(left) python -m pytest -q -p no:cacheprovider -n 4 -rf -k pre tests/gpu/test_variants_gpu.py > "$res/variants.log" 2>&1
  step "variants (pre) rc=$? $(tail -n 1 "$res/variants.log")" ) &
tests=$!
export CUDA_VISIBLE_DEVICES=0
for w in old new; do
  ( cd /tmp/t-$w && PYTHONPATH=/tmp/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$w timeout 300 python $P /dev/null compile > "$res/compile-$w.log" 2>&1 ) &
done
wait $(jobs -p | grep -vx "$tests"); step compiled
run() {  # TREE OUT [cells]
  ( cd /tmp/t-$1 && PYTHONPATH=/tmp/t-$1:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$1 PACKED_CELLS="$3" \
      timeout $(left) python $P "$res/$2" > /dev/null 2> "$res/$2.err" )
  step "$1 $2 rc=$?"
}
B1="1,1,bf16;1,2,bf16;1,4,bf16;1,8,bf16;1,4,fp32;1,8,fp32"
run old b1-old-1.jsonl "$B1"; run new b1-new-1.jsonl "$B1"
run old all-old.jsonl ""; run new all-new.jsonl ""
run old b1-old-2.jsonl "$B1"; run new b1-new-2.jsonl "$B1"
wait; step done
