#!/bin/bash
# Issue 18 on one or two GPUs, from the repo root after the bundles' setup (machine A of the record):
#   timing GPU (0): packed_forms.py through the dispatch (the form-rule cells and bf16 B=1 T=8),
#                   then form_sweep.py at B = 1 (bf16 T = 2 and 8, the small-tile variants);
#   test GPU (1, or 0 on one GPU): the engine-form tests, then the variant tests.
# usage: bash i18.sh RES DEADLINE_S
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
gpus=$(nvidia-smi -L | wc -l); tg=0; xg=$(( gpus > 1 ? 1 : 0 ))
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-packed/packed_forms.py; F=docs/perf/raw/h100-spec-form-b1/form_sweep.py
export PACKED_CELLS="128,2,bf16;512,2,bf16;128,8,bf16;256,8,bf16;1,8,bf16;1,2,bf16"
export SWEEP_CELLS="1,2,bf16;1,8,bf16" SWEEP_FORMS=pos_dense,spec
export SWEEP_VARIANTS=kl_bf16_tv8_ilp1_vec8_tpg16_sm90,kl_bf16_tv8_ilp2_vec8_tpg16_pre_sm90,kl_bf16_tv8_ilp2_vec8_tpg16_sm90,kl_bf16_tv16_ilp2_vec8_tpg16_sm90,kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90,kl_bf16_tv16_ilp4_vec8_tpg16_sm90,kl_bf16_tv32_ilp4_vec8_tpg16_sm90
tests() {  # the GPU tests, on their own GPU and cache
  ( export CUDA_VISIBLE_DEVICES=$xg GDNGEN_CACHE_DIR=/tmp/gc-tests
    timeout $(left) python -m pytest -q -p no:cacheprovider -n 2 -rf tests/gpu/test_engine_forms_gpu.py \
      > "$res/engine-forms-tests.log" 2>&1
    step "engine-form tests rc=$? $(tail -n 1 "$res/engine-forms-tests.log")"
    timeout $(left) python -m pytest -q -p no:cacheprovider -n $(( gpus > 1 ? 3 : 2 )) -rf \
      tests/gpu/test_variants_gpu.py > "$res/variants-tests.log" 2>&1
    step "variant tests rc=$? $(tail -n 1 "$res/variants-tests.log")" ) &
}
tests
export CUDA_VISIBLE_DEVICES=$tg GDNGEN_CACHE_DIR=/tmp/gc
( timeout 300 python $P /dev/null compile > "$res/compile-packed.log" 2>&1 ) &
for c in 0 1; do ( timeout 300 python $F /dev/null compile $c > "$res/compile-sweep-$c.log" 2>&1 ) & done
wait $(jobs -p | tail -n 3)
step "compiled"
timeout $(left) python $P "$res/packed.jsonl" > /dev/null 2> "$res/packed.err"; step "packed rc=$?"
timeout $(left) python $F "$res/sweep-b1.jsonl" > "$res/sweep-b1.out" 2> "$res/sweep-b1.err"; step "sweep rc=$?"
timeout $(left) python $P "$res/packed-2.jsonl" > /dev/null 2> "$res/packed-2.err"; step "packed 2 rc=$?"
wait; step done
