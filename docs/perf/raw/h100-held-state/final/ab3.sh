#!/bin/bash
# scratch: main (head.tar.xz), this tree (new) and gates-in-loop (gl.tar.xz), side by side on GPU 0
# through h200.gdn_decode; GPU tests of new, then gl, on GPU 1.
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
gpus=$(nvidia-smi -L | wc -l); xg=$(( gpus > 1 ? 1 : 0 ))
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-packed/packed_forms.py
rm -rf /tmp/t-old /tmp/t-new /tmp/t-gl && mkdir -p /tmp/t-old /tmp/t-new /tmp/t-gl
cp -r gdngen generated docs tests /tmp/t-new/ && for w in old gl; do cp -r docs tests /tmp/t-$w/; done
tar -xJf scratch/s35/head.tar.xz -C /tmp/t-old; tar -xJf scratch/s35/gl.tar.xz -C /tmp/t-gl
tests() {
  for w in new gl; do
  ( cd /tmp/t-$w && export CUDA_VISIBLE_DEVICES=$xg GDNGEN_CACHE_DIR=/tmp/gc-tests-$w PYTHONPATH=/tmp/t-$w:$PYTHONPATH
    timeout $(left) python -m pytest -q -p no:cacheprovider -n 4 -rf tests/gpu/test_variants_gpu.py -k spec_form > "$res/tests-$w-variants.log" 2>&1
    step "$w variants spec form rc=$? $(tail -n 1 "$res/tests-$w-variants.log")"
    timeout $(left) python -m pytest -q -p no:cacheprovider -n 3 -rf tests/gpu/test_engine_forms_gpu.py > "$res/tests-$w-engine.log" 2>&1
    step "$w engine forms rc=$? $(tail -n 1 "$res/tests-$w-engine.log")" )
  done
}
[ "$gpus" -gt 1 ] && { tests & }
export CUDA_VISIBLE_DEVICES=0
C="1,2,bf16;1,3,bf16;1,4,bf16;1,8,bf16;1,2,fp32;1,3,fp32;1,3,fp16;1,8,fp16;128,3,bf16;32,4,bf16"
for w in old new gl; do
  ( cd /tmp/t-$w && PYTHONPATH=/tmp/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$w PACKED_CELLS="$C" timeout 300 python $P /dev/null compile > "$res/compile-$w.log" 2>&1 ) &
done
wait $(jobs -p | tail -n 3); step compiled
run() {  # TREE OUT
  ( cd /tmp/t-$1 && PYTHONPATH=/tmp/t-$1:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$1 PACKED_CELLS="$C" \
      timeout $(left) python $P "$res/ab-$2.jsonl" > /dev/null 2> "$res/ab-$2.err" )
  step "$1 $2 rc=$?"
}
run old old-1; run new new-1; run gl gl-1; run gl gl-2; run new new-2; run old old-2
wait; step done
