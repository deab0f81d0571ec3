#!/bin/bash
# scratch: state-raw.diff (scratch/s35/raw.tar.xz: its gdngen and generated) against main (this tree),
# side by side on GPU 0, then the fp32 B = 1 form sweep on main; the GPU tests of the diff's tree
# on GPU 1 (after the timing on a one-GPU machine).
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
gpus=$(nvidia-smi -L | wc -l); xg=$(( gpus > 1 ? 1 : 0 ))
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-packed/packed_forms.py; F=docs/perf/raw/h100-spec-form-b1/form_sweep.py
rm -rf /tmp/t-old /tmp/t-new && mkdir -p /tmp/t-old /tmp/t-new
cp -r gdngen generated docs /tmp/t-old/ && cp -r docs /tmp/t-new/ && tar -xJf scratch/s35/raw.tar.xz -C /tmp/t-new
cp -r tests /tmp/t-new/ && cp pyproject.toml /tmp/t-new/ 2>/dev/null
tests() {
  ( cd /tmp/t-new && export CUDA_VISIBLE_DEVICES=$xg GDNGEN_CACHE_DIR=/tmp/gc-tests PYTHONPATH=/tmp/t-new:$PYTHONPATH
    timeout $(left) python -m pytest -q -p no:cacheprovider -n 4 -rf tests/gpu/test_engine_forms_gpu.py \
      tests/gpu/test_call_gpu.py tests/gpu/test_gated_norm_gpu.py > "$res/tests.log" 2>&1
    step "tests rc=$? $(tail -n 1 "$res/tests.log")"
    timeout $(left) python -m pytest -q -p no:cacheprovider -n 4 -rf -k "bf16 or fp16" tests/gpu/test_variants_gpu.py > "$res/variants.log" 2>&1
    step "variants (16-bit) rc=$? $(tail -n 1 "$res/variants.log")" ) &
}
[ "$gpus" -gt 1 ] && tests
export CUDA_VISIBLE_DEVICES=0
B1="1,2,bf16;1,3,bf16;1,4,bf16;1,8,bf16;1,3,fp32;32,8,bf16;128,4,bf16;512,2,bf16"
export SWEEP_CELLS="1,2,fp32;1,3,fp32;1,4,fp32" SWEEP_FORMS=pos_dense,spec
for w in old new; do
  ( cd /tmp/t-$w && PYTHONPATH=/tmp/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$w PACKED_CELLS="$B1" timeout 300 python $P /dev/null compile > "$res/compile-$w.log" 2>&1 ) &
done
for c in 0 1 2; do ( cd /tmp/t-old && PYTHONPATH=/tmp/t-old:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-old timeout 300 python $F /dev/null compile $c > "$res/compile-sweep-$c.log" 2>&1 ) & done
wait $(jobs -p | tail -n 5); step compiled
run() {  # TREE OUT cells
  ( cd /tmp/t-$1 && PYTHONPATH=/tmp/t-$1:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$1 PACKED_CELLS="$3" \
      timeout $(left) python $P "$res/$2" > /dev/null 2> "$res/$2.err" )
  step "$1 $2 rc=$?"
}
run old ab-old-1.jsonl "$B1"; run new ab-new-1.jsonl "$B1"
( cd /tmp/t-old && PYTHONPATH=/tmp/t-old:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-old timeout $(left) python $F "$res/sweep-fp32.jsonl" > "$res/sweep-fp32.out" 2> "$res/sweep-fp32.err" ); step "sweep rc=$?"
run new ab-new-2.jsonl "$B1"; run old ab-old-2.jsonl "$B1"
[ "$gpus" -gt 1 ] || tests
wait; step done
