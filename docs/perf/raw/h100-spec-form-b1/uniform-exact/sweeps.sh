# The two form sweeps of 2026-11-27 (runs 2 and 3 of ../../../h100-2026-11-27-uniform-exact.md),
# each one device call on a fresh H100 after the call that carries .devbundle, carrying .devb2,
# from the repository root. usage: bash sweeps.sh RUN OUT   (RUN: 2 or 3)
source .devb2/setup.sh > /dev/null 2>&1
export GDNGEN_CACHE_DIR=/tmp/gc SWEEP_FORMS=pos_dense,pos_packed,spec
R=$2; mkdir -p "$R"; F=docs/perf/raw/h100-spec-form-b1/form_sweep.py
if [ "$1" = 2 ]; then
  export SWEEP_CELLS="128,8,bf16;512,2,bf16"
  export SWEEP_VARIANTS=kl_bf16_tv16_ilp4_vec8_tpg16_sm90,kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90,kl_bf16_tv64_ilp8_vec8_tpg16_sm90,kl_bf16_tv64_ilp8_vec8_tpg16_staged_sm90,kl_bf16_tv128_ilp8_vec8_tpg16_staged_sm90,kl_bf16_tv128_ilp4_vec8_tpg16_passes4_pf_staged_sm90,kl_bf16_tv64_ilp8_vec8_tpg16_ldcs_stcs_sm90,kl_bf16_tv32_ilp4_vec8_tpg16_sm90
else
  export SWEEP_CELLS="128,2,bf16;128,4,bf16;128,4,fp32;512,4,bf16;256,8,bf16;256,8,fp32"
  export SWEEP_VARIANTS=kl_bf16_tv16_ilp4_vec8_tpg16_sm90,kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90,kl_bf16_tv64_ilp8_vec8_tpg16_sm90,kl_bf16_tv64_ilp8_vec8_tpg16_ldcs_stcs_sm90,kl_bf16_tv128_ilp8_vec8_tpg16_staged_sm90,kl_bf16_tv32_ilp4_vec8_tpg16_sm90,kl_fp32_tv8_ilp2_vec4_tpg32_sm90,kl_fp32_tv8_ilp2_vec4_tpg32_pre_sm90,kl_fp32_tv16_ilp4_vec4_tpg32_sm90,kl_fp32_tv16_ilp4_vec4_tpg32_pre_sm90,kl_fp32_tv16_ilp4_vec4_tpg32_staged_sm90,kl_fp32_tv64_ilp8_vec4_tpg32_sm90
fi
n=$(( $(echo "$SWEEP_CELLS" | tr -cd ';' | wc -c) + 1 )); s=$(date +%s)
for c in $(seq 0 $(( n - 1 ))); do timeout 240 python $F /dev/null compile $c > "$R/compile-$c.log" 2>&1 & done
wait; echo compiled $(( $(date +%s) - s ))s >> "$R/steps.log"
timeout $(( 545 - ($(date +%s) - s) )) python $F "$R/sweep.jsonl" > "$R/sweep.out" 2> "$R/sweep.err"
echo sweep rc=$? $(( $(date +%s) - s ))s >> "$R/steps.log"
# run 2 then timed packed_forms.py (all cells) on the same tree:
[ "$1" = 2 ] && timeout $(( 550 - ($(date +%s) - s) )) python docs/perf/raw/h100-packed/packed_forms.py "$R/packed-new-2.jsonl" > /dev/null 2> "$R/packed.err"
tar -czf "$R.tgz" -C "$(dirname "$R")" "$(basename "$R")"  # one file comes back whatever the count
