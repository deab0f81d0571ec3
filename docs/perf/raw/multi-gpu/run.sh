# Issue 21 on a machine of two or more GPUs of one host (nvidia-h100-x2/x4, nvidia-h200-x2/x4),
# then issue 19's measurement backlog spread over its GPUs, one lane per GPU. From the repo root
# of main's tree on the device:
#   source .devbundle/setup.sh; bash docs/perf/raw/multi-gpu/run.sh RES DEADLINE_S [PHASE]
# PHASE: issue21 (steps 1 and 2), lanes (step 3), lanes2 (step 3's second call on an H200) or
# all (issue21 and lanes); a device call runs for at most 600 s, so a session runs each phase
# in a call of its own. Keep DEADLINE_S
# at 500 or less where the same call unpacks bundles (setup.sh) and the jobs' tables are written
# after it: a 540 s deadline once ran past the call's 600 s and brought nothing back.
# (with the peers, FlashInfer and FLA, installed by setup.sh: the lanes bench beside them).
#  1. tests/gpu/test_multi_gpu.py: tensors on the second GPU while the first is current (eager
#     and in a CUDA graph), one call object on both GPUs, two processes on one empty cache;
#  2. `python -m gdngen.bench.startup`, three rounds of 1, 2 (and 4, where there are 4) processes
#     starting at once, one per GPU, each round on a fresh empty cache; nothing else runs then,
#     so the compiles have the CPUs to themselves as at an engine's start;
#  3. one lane per GPU, side by side: what is left of issue 19's measurements on this GPU model
#     (step 3's comment says what, per model).
# Everything lands in RES; `tar` it into $OUT (at most 8 files come back).
res=$1; deadline=$2; phase=${3:-all}; mkdir -p "$res"; start=$(date +%s)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); raw=$(dirname "$here")
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpus.txt"
nvidia-smi topo -m >> "$res/gpus.txt" 2>&1
step "$gpus GPUs"
if [ "$gpus" -lt 2 ]; then step "fewer than 2 GPUs: nothing of issue 21 can run here"; exit 1; fi

if [ "$phase" = all ] || [ "$phase" = issue21 ]; then
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
fi
[ "$phase" = issue21 ] && { step done; exit 0; }

# 3. the lanes, one per GPU (CUDA_VISIBLE_DEVICES), each taking its GPU in turns through a lock
#    of its own. The backlog is what the docs/perf files of 2026-11-25 and 2026-11-26 list as not
#    yet benched per GPU model, most wanted first, dealt round-robin to the lanes:
#    H:HVS:LAYOUT/DTYPE:TOKENS:MODES (bench_grid.sh's jobs; B 1, 32 and 512).
#    H200, phase lanes: K-last fp16 is re-tuned (its one-pass staged kernel changed code under the
#    same names, as the H100's did on 2026-11-26): T 2/4/8 on GPU 0 and, where there are 4 GPUs,
#    T 1 on GPU 1; the files are merged into specs/h200.tuning.yaml and the target re-emitted in
#    a copy of the tree, RES/retuned (no GPU; the lanes still benching keep the tree they started
#    on). The other GPUs bench the re-tuned K-last bf16 tables out of sample, then the TP grid's
#    cells not benched on an H200.
#    H200, phase lanes2 (the next call, same RES on the still-warm machine): the tree takes
#    RES/retuned's table, every GPU benches K-last fp16 on it, then the backlog jobs phase lanes
#    did not finish.
#    H100: GPU 0 first retimes the two HV 4 K-last bf16 cells that read +5.5% and +6.8%
#    (h100-2026-11-26-grid-backlog.md); every GPU then benches the K-last bf16 cells left out.
every_shard() { for shard in 2:4,6,8 4:12,16 8:24 16:32,48,64; do echo "$shard:$1"; done; }
tuned=()  # per tuning GPU: its tune.sh jobs
case "$(head -n 1 "$res/gpus.txt")" in
  *H200*)
    tuned=("k_last/fp16:8:32,48,64:128 k_last/fp16:8:4,6,8,12,16,24:128 k_last/fp16:4::128 k_last/fp16:2::128")
    if [ "$gpus" -ge 4 ]; then tuned+=("k_last/fp16:1::128"); else tuned[0]+=" k_last/fp16:1::128"; fi
    backlog=(
      $(every_shard k_last/bf16:8:update,verify) $(every_shard k_last/bf16:4:update,verify)
      $(every_shard k_last/bf16:1,2:update,verify)
      2:4,6,8:k_last/fp32:8:verify 4:12,16:k_last/fp32:8:verify 16:48:k_last/fp32:8:verify
      2:4,6,8:k_last/fp32:4:verify $(every_shard v_last/fp32:2,4,8:update)
      $(every_shard v_last/fp16:4,8:update) $(every_shard v_last/bf16:2,4,8:verify)
      $(every_shard v_last/fp32:2,4,8:verify)
    )
    if [ "$phase" = lanes2 ]; then
      # the backlog jobs no earlier lane finished (a job stopped at the deadline is benched again)
      left_over=()
      for job in "${backlog[@]}"; do
        grep -qsxF "$job rc=0" <(sed 's/ [0-9]* s (started.*//' "$res"/gpu*/steps.log) \
          || left_over+=("$job")
      done
      backlog=($(for T in 1 2 4 8; do every_shard k_last/fp16:$T:update,verify; done)
        "${left_over[@]}")
      tuned=()
      retuned=$res/retuned; res=$res/lanes2; mkdir -p "$res"
      if [ -e "$retuned/specs/h200.tuning.yaml" ]; then
        cp "$retuned/specs/h200.tuning.yaml" specs/
        cp "$retuned"/generated/h200/{dispatch.py,MANIFEST.txt} generated/h200/
        step "the re-tuned K-last fp16 table is in the tree"
      else
        step "no re-tuned table in $retuned: K-last fp16 is benched on the committed one"
      fi
    fi ;;
  *)
    backlog=(
      2:4,6,8:k_last/bf16:2:update,verify 16:48,64:k_last/bf16:2:update
      16:32,48,64:k_last/bf16:2:verify 2:6,8:k_last/bf16:4,8:verify
      16:32,48,64:k_last/bf16:4:verify 16:48,64:k_last/bf16:8:verify
    ) ;;
esac
first=${#tuned[@]}
lanes=$(( gpus - first ))
L=$(left); step "lanes with $L s: ${#tuned[@]} tuning GPUs, a backlog of ${#backlog[@]} jobs over $lanes"
retune() {  # the tuning GPUs, then the merge and the emit in RES/retuned
  for (( gpu = 0; gpu < first; gpu++ )); do
    ( CUDA_VISIBLE_DEVICES=$gpu RT_DIR=/tmp/rt$gpu bash "$raw/h100-tune/tune.sh" 8 "$L" \
        ${tuned[gpu]} > "$res/gpu$gpu-tune.log" 2>&1
      cp -r /tmp/rt$gpu "$res/rt$gpu" ) &
  done
  wait
  step "re-tune ended: $(ls "$res"/rt*/*.yaml 2>/dev/null | wc -l) tuning files"
  local tree=$res/retuned
  mkdir -p "$tree" && cp -r gdngen generated specs pyproject.toml "$tree"/
  ( cd "$tree" && PYTHONPATH="$tree:$PYTHONPATH" python -m gdngen merge-tuning \
      specs/h200.yaml specs/h200.tuning.yaml "$res"/rt*/*.yaml \
    && PYTHONPATH="$tree:$PYTHONPATH" python -m gdngen emit specs/h200.yaml ) \
    > "$res/retuned.log" 2>&1
  step "merge and emit rc=$?"
}
[ $first -gt 0 ] && retune &
retime_hv4() {  # the H100's GPU 0, before its share of the backlog
  cp specs/h200.tuning.h100.yaml "$res/retime-hv4.yaml"  # merged here with merge-tuning
  timeout 240 python -m gdngen tune specs/h200.yaml --retime --pairs k_last/bf16 --tokens 1,2 \
    --heads 4 --head-dims 128 --out "$res/retime-hv4.yaml" > "$res/retime-hv4.log" 2>&1
  step "retime rc=$?"
}
for (( gpu = first; gpu < gpus; gpu++ )); do
  jobs=()
  for (( j = gpu - first; j < ${#backlog[@]}; j += lanes )); do jobs+=("${backlog[j]}"); done
  ( export CUDA_VISIBLE_DEVICES=$gpu
    [ $gpu = 0 ] && [ "$phase" != lanes2 ] && retime_hv4
    MARGIN=0.01 bash "$raw/tp-bench-t/bench_grid.sh" "$res/gpu$gpu" "$(left)" 8 "${jobs[@]}" \
      > "$res/gpu$gpu.log" 2>&1 ) &
done
wait
step done
