# Issue 21 on a machine of two or more GPUs of one host (nvidia-h100-x2/x4, nvidia-h200-x2/x4),
# then issue 19's measurement backlog spread over its GPUs, one lane per GPU. From the repo root
# of main's tree on the device:
#   source .devbundle/setup.sh; bash docs/perf/raw/multi-gpu/run.sh RES DEADLINE_S
# (with the peers, FlashInfer and FLA, installed by setup.sh: the lanes bench beside them).
#  1. tests/gpu/test_multi_gpu.py: tensors on the second GPU while the first is current (eager
#     and in a CUDA graph), one call object on both GPUs, two processes on one empty cache;
#  2. `python -m gdngen.bench.startup`, three rounds of 1, 2 (and 4, where there are 4) processes
#     starting at once, one per GPU, each round on a fresh empty cache; nothing else runs then,
#     so the compiles have the CPUs to themselves as at an engine's start;
#  3. one lane per GPU, side by side (CUDA_VISIBLE_DEVICES; each lane's jobs take turns on its
#     GPU through a lock of their own): GPU 0 runs kl-bf16-landed/run.sh (the repeats, the
#     re-tuned K-last bf16 tables out of sample, the K-last fp16 re-tune), the other GPUs the
#     TP grid's cells not yet benched on this GPU model (the lists below), round-robin.
# Everything lands in RES; `tar` it into $OUT (at most 8 files come back).
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); raw=$(dirname "$here")
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpus.txt"
nvidia-smi topo -m >> "$res/gpus.txt" 2>&1
step "$gpus GPUs"
if [ "$gpus" -lt 2 ]; then step "fewer than 2 GPUs: nothing of issue 21 can run here"; exit 1; fi

# 1. the multi-GPU tests (their own empty disk cache, so the two-process test starts cold)
GDNGEN_CACHE_DIR=/tmp/gc-multi timeout $(left) python -m pytest -q -rA -p no:cacheprovider \
  tests/gpu/test_multi_gpu.py > "$res/multi-gpu-tests.log" 2>&1
step "multi-gpu tests rc=$?"

# 2. start-up of N processes against 1
counts=1,2; [ "$gpus" -ge 4 ] && counts=1,2,4
for round in 1 2 3; do
  timeout $(left) python -m gdngen.bench.startup --processes $counts --out "$res/startup-$round" \
    > "$res/startup-$round.log" 2>&1
  step "startup round $round ($counts) rc=$?"
done

# 3. the lanes. The backlog is what docs/perf/h100-h200-2026-11-25-tp-grid.md and
#    -retune-staged.md list as not yet benched, per GPU model, most wanted first:
#    H:HVS:LAYOUT/DTYPE:TOKENS:MODES (bench_grid.sh's jobs; B 1, 32 and 512).
every_shard() { for shard in 2:4,6,8 4:12,16 8:24 16:32,48,64; do echo "$shard:$1"; done; }
both=( $(every_shard v_last/fp16:4,8:update) $(every_shard v_last/bf16:2,4,8:verify)
  $(every_shard v_last/fp32:2,4,8:verify) $(every_shard k_last/fp16:1,2,4,8:verify) )
case "$(head -n 1 "$res/gpus.txt")" in
  *H200*) backlog=(
    2:4,6,8:k_last/fp32:8:verify 4:12,16:k_last/fp32:8:verify 16:48:k_last/fp32:8:verify
    2:4,6,8:k_last/fp32:4:verify $(every_shard v_last/fp32:2,4,8:update)
    4:12,16:k_last/fp16:1,2:update 8:24:k_last/fp16:1,2:update 16:32,48,64:k_last/fp16:1,2:update
    "${both[@]}"
  ) ;;
  *) backlog=(
    2:4,6,8:k_last/fp32:8:verify 4:12,16:k_last/fp32:8:verify 16:32,48,64:k_last/fp32:8:verify
    2:4,6,8:k_last/fp32:2,4:verify 2:4,6,8:k_last/fp16:4,8:update
    "${both[@]}"
  ) ;;
esac
L=$(left); step "lanes with $L s, backlog of ${#backlog[@]} jobs over $(( gpus - 1 )) GPUs"
CUDA_VISIBLE_DEVICES=0 bash "$raw/kl-bf16-landed/run.sh" "$res/gpu0" "$L" \
  > "$res/gpu0.log" 2>&1 &
for (( gpu = 1; gpu < gpus; gpu++ )); do
  jobs=()
  for (( j = gpu - 1; j < ${#backlog[@]}; j += gpus - 1 )); do jobs+=("${backlog[j]}"); done
  CUDA_VISIBLE_DEVICES=$gpu MARGIN=0.01 bash "$raw/tp-bench-t/bench_grid.sh" "$res/gpu$gpu" \
    "$L" 8 "${jobs[@]}" > "$res/gpu$gpu.log" 2>&1 &
done
wait
step done
