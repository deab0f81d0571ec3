# Three device calls on one H100 (after the 4-GPU lanes of raw/multi-gpu/run.sh), PHASE 1-3:
#  bench: cells benched beside FlashInfer and FLA with the variants the tuning timed within
#    MARGIN of the best (`gdngen bench --variants contenders`), up to 8 processes taking turns
#    on the GPU.
#    1: the cells whose dispatch changed when neighbouring HV exceptions began to share a rule
#       (gdngen/dispatch/measured.py, head_exceptions): K-last bf16 T = 8 verify at B*HV ~ 256
#       for HV 6, 8, 12 (between HV 4 and 16), T = 1 update at B*HV ~ 1024 for HV 6 to 48.
#    2: T = 1 update at B*HV ~ 1024 for HV 6/8/12 again, on the table without the HV 4 retime,
#       and HV 4 B 256 itself; T = 8 verify HV 8 B 32 three times (0.99x FlashInfer once).
#  sweep: core_sweep.py, the fused core on every norm-capable kernel (DTYPE:TOKENS:BATCHES:HEADS).
#    1: bf16 and fp32 T = 1, HV 32/64, B 64/256/512; bf16 T = 2/4/8, B 64/256, HV 32.
#    2: the same T = 1 cells with four gated_norm_only kernels tried in specs/h200.yaml (bf16
#       tv128_ilp4, tv64_ilp4; fp32 tv64_ilp8, tv128_ilp8), then bf16 T = 2/4 B 64/256 HV 32.
#    3: fp32 with the kept kernel (tv64_ilp8) and its rule: T = 1 at B 4/16/32 (where the rule
#       should start), T = 1 with the norm alone (`norm`), T = 2/4/8 at B 64/256.
#  3 also runs the GPU tests of the fused steps first (test_conv_gpu.py, test_gated_norm_gpu.py,
#  4 workers) and the core bench (gdngen.bench.core) of fp32 T = 1 last.
#  4: with the fp32 rules that take tv64_ilp8: the fp32 tests of test_conv_gpu.py, then the core
#     bench of fp32 at T = 1, 2 and 4.
# usage (repository root, after `source .devb2/setup.sh`): bash run.sh RES DEADLINE_S PHASE
res=$1; deadline=$2; phase=$3; mkdir -p "$res"; start=$(date +%s)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
left() { echo $(( deadline - ($(date +%s) - start) )); }
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
if [ "$phase" = 1 ]; then
  cells=(  # H:HV:T:mode:B:MARGIN:TAG
    2:8:8:verify:32:0.01: 2:6:8:verify:43:0.01: 4:12:8:verify:21:0.01:
    2:6:1:update:171:0.01: 2:8:1:update:128:0.01: 4:12:1:update:85:0.01:
    8:24:1:update:43:0.01: 16:32:1:update:32:0.01: 16:48:1:update:21:0.01:
  )
  sweeps=(bf16:1:64,256,512:32,64 fp32:1:64,256,512:32,64 bf16:2,4,8:64,256:32)
elif [ "$phase" = 2 ]; then
  cells=(
    2:6:1:update:171:0.03: 2:8:1:update:128:0.03: 4:12:1:update:85:0.03: 2:4:1:update:256:0.03:
    2:8:8:verify:32:0.05:-r1 2:8:8:verify:32:0.05:-r2 2:8:8:verify:32:0.05:-r3
  )
  sweeps=(bf16:1:64,256,512:32,64 fp32:1:64,256,512:32,64 bf16:2,4:64,256:32)
elif [ "$phase" = 4 ]; then
  cells=(); sweeps=()
  GDNGEN_CACHE_DIR=/tmp/gc-tests timeout 200 python -m pytest -q -p no:cacheprovider -n 4 \
    tests/gpu/test_conv_gpu.py -k fp32 > "$res/gpu-tests.log" 2>&1
  step "GPU tests rc=$? ($(tail -n 1 "$res/gpu-tests.log"))"
else
  cells=()
  sweeps=(fp32:1:4,16,32:32,64 fp32:1:64,256,512:32,64:norm fp32:2,4,8:64,256:32)
  GDNGEN_CACHE_DIR=/tmp/gc-tests timeout 240 python -m pytest -q -p no:cacheprovider -n 4 \
    tests/gpu/test_conv_gpu.py tests/gpu/test_gated_norm_gpu.py > "$res/gpu-tests.log" 2>&1
  step "GPU tests rc=$? ($(tail -n 1 "$res/gpu-tests.log"))"
fi
bench() {
  IFS=: read -r H HV T mode B margin tag <<< "$1"
  name=hv$HV-t$T-$mode-b$B$tag
  timeout -s TERM "$2" python -m gdngen bench --qk-heads $H --hv $HV --layout k_last \
    --state-dtype bf16 --tokens $T --mode $mode --batch $B --variants contenders \
    --contender-margin $margin --peers flashinfer,fla --gpu-lock "$res/bench/gpu.lock" \
    --out "$res/bench/$name" > "$res/bench/$name.log" 2>&1
  echo "$1 rc=$?" >> "$res/bench/steps.log"
}
export -f bench; export res
mkdir -p "$res/bench"
if [ ${#cells[@]} -gt 0 ]; then
  printf '%s\n' "${cells[@]}" | xargs -P 8 -I{} bash -c "bench {} $(( $(left) / 3 ))"
  step "bench ended"
fi
for sweep in "${sweeps[@]}"; do
  IFS=: read -r dtype tokens batches heads form <<< "$sweep"
  timeout $(( $(left) - 10 )) python "$here/core_sweep.py" "$res/sweep.jsonl" $dtype $tokens \
    $batches $heads $form > "$res/sweep-$dtype-t${tokens//,/}$form.log" 2>&1
  step "sweep $sweep rc=$?"
done
if [ "$phase" = 3 ] || [ "$phase" = 4 ]; then
  tokens=1; [ "$phase" = 4 ] && tokens=1,2,4
  timeout $(( $(left) - 5 )) python -m gdngen.bench.core --out "$res/core" --batches 1,16,64,256,512 \
    --tokens $tokens --heads 32,64 --dtypes fp32 > "$res/core.log" 2>&1
  step "core bench fp32 T=$tokens rc=$?"
fi
