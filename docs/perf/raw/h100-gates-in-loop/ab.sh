#!/bin/bash
# scratch: HEAD (head.tar.xz), this tree (new: gates in the token loop behind the slot table, ILP 4
# preloading kernels) and gla (gates in the loop in every form) side by side on GPU 0 through
# h200.gdn_decode; GPU tests of new on GPU 1 (after the timing where there is one GPU).
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
gpus=$(nvidia-smi -L | wc -l); xg=$(( gpus > 1 ? 1 : 0 ))
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-packed/packed_forms.py
G=${GPU:-0}; W=/tmp/g$G
rm -rf $W && mkdir -p $W/t-old $W/t-new $W/t-gla
cp -r gdngen generated docs tests $W/t-new/ && for w in old gla; do cp -r docs tests $W/t-$w/; done
tar -xJf scratch/s36/head.tar.xz -C $W/t-old; tar -xJf scratch/s36/gla.tar.xz -C $W/t-gla
tests() {
  ( cd $W/t-new && export CUDA_VISIBLE_DEVICES=$xg GDNGEN_CACHE_DIR=$W/gc-tests-new PYTHONPATH=$W/t-new:$PYTHONPATH
    timeout $(left) python -m pytest -q -p no:cacheprovider -n 3 -rf tests/gpu/test_variants_gpu.py -k spec_form > "$res/tests-new-variants.log" 2>&1
    step "new variants spec form rc=$? $(tail -n 1 "$res/tests-new-variants.log")"
    timeout $(left) python -m pytest -q -p no:cacheprovider -n 3 -rf tests/gpu/test_engine_forms_gpu.py > "$res/tests-new-engine.log" 2>&1
    step "new engine forms rc=$? $(tail -n 1 "$res/tests-new-engine.log")" )
}
[ "${TESTS:-1}" = 1 ] && [ "$gpus" -gt 1 ] && { tests & }
export CUDA_VISIBLE_DEVICES=$G
C="${CELLS:-1,4,bf16;1,8,bf16;1,8,fp16;2,2,fp32;2,3,fp32;1,2,bf16}"
for w in old new gla; do
  ( cd $W/t-$w && PYTHONPATH=$W/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=$W/gc-$w PACKED_CELLS="$C" timeout 300 python $P /dev/null compile > "$res/compile-$w.log" 2>&1 ) &
done
wait $(jobs -p | tail -n 3); step compiled
run() {  # TREE OUT
  ( cd $W/t-$1 && PYTHONPATH=$W/t-$1:$PYTHONPATH GDNGEN_CACHE_DIR=$W/gc-$1 PACKED_CELLS="$C" \
      timeout $(left) python $P "$res/ab-$2.jsonl" > /dev/null 2> "$res/ab-$2.err" )
  step "$1 $2 rc=$?"
}
run old old-1; run new new-1; run gla gla-1; run gla gla-2; run new new-2; run old old-2
[ "${TESTS:-1}" = 1 ] && [ "$gpus" -eq 1 ] && tests
wait; step done
