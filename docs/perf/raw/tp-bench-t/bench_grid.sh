# Bench the tensor-parallel shards' grid (issue 19) beside FlashInfer and FLA, with the variants
# the tuning timed within MARGIN (default 3%) of each cell's best, on the GPU this runs on.
# One `gdngen bench` process per job; WORKERS of them at a time share the GPU in turns
# (--gpu-lock), compiling side by side. Each writes OUT/<tag>.jsonl cell by cell; a job still
# running at the deadline is stopped with SIGTERM and writes the tables of the cells it
# finished (or, if it ended without them, `gdngen bench-tables` renders its .jsonl).
#
# usage: bash bench_grid.sh OUT DEADLINE_S WORKERS JOB...
#   JOB = H:HVS:LAYOUT/DTYPE:TOKENS:MODES, e.g. 2:4,6,8:k_last/bf16:2,4,8:update,verify
#   (H: q/k heads of the shard, HVS: its value-head counts; batches are BATCHES, default
#   1,32,512)
out=$1; deadline=$2; workers=$3; shift 3
mkdir -p "$out"
start=$(date +%s)
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$out/gpu.txt"
job() {
  IFS=: read -r H hvs pair tokens modes <<< "$1"
  tag=h$H-${pair/\//-}-t${tokens//,/}-${modes//,/-}
  left=$(( deadline - ($(date +%s) - start) ))
  if [ $left -lt 60 ]; then echo "$1 not started (deadline)" >> "$out/steps.log"; return; fi
  s=$(date +%s)
  timeout -s TERM $left python -m gdngen bench --qk-heads $H --hv $hvs --layout ${pair%/*} \
    --state-dtype ${pair#*/} --tokens $tokens --mode $modes --batch ${BATCHES:-1,32,512} \
    --variants contenders --contender-margin ${MARGIN:-0.03} --peers flashinfer,fla \
    --gpu-lock "$out/gpu.lock" --out "$out/$tag" > "$out/$tag.log" 2>&1
  echo "$1 rc=$? $(( $(date +%s) - s )) s (started at +$(( s - start )) s)" >> "$out/steps.log"
  # a run that ended without writing its tables left its records: render those
  [ -e "$out/$tag.jsonl" ] && python -m gdngen bench-tables "$out/$tag.jsonl" --out "$out/$tag" \
    > /dev/null 2>> "$out/$tag.log"
}
export -f job; export out start deadline
printf '%s\n' "$@" | xargs -P "$workers" -I{} bash -c 'job "$1"' _ {}
echo "all jobs ended at +$(( $(date +%s) - start )) s" >> "$out/steps.log"
