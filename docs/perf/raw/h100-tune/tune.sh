# Tune specs/h200.yaml on the GPU of the device machine, one process per (pair, T), WORKERS at a
# time, taking turns on the GPU (--gpu-lock); each writes its own file under /tmp/rt, merged later
# with `gdngen merge-tuning specs/h200.yaml /tmp/rt/*.yaml` (which writes the running GPU model's
# tuning file, here specs/h200.tuning.h100.yaml).
# usage: bash docs/perf/raw/h100-tune/tune.sh WORKERS DEADLINE_S job...   (job = layout/dtype:T)
set -o pipefail
workers=$1; deadline=$2; shift 2
W=/tmp/rt; mkdir -p $W
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee -a $W/gpu.txt
start=$(date +%s)
job() {
  pair=${1%:*}; T=${1#*:}; tag=${pair/\//-}-t$T
  s=$(date +%s)
  timeout $(( deadline - (s - start) - 15 )) python -m gdngen tune specs/h200.yaml --pairs $pair --tokens $T \
    --gpu-lock $W/gpu.lock --out $W/$tag.yaml > $W/$tag.log 2>&1
  echo "$pair T=$T rc=$? $(( $(date +%s) - s )) s (started at +$(( s - start )) s)" >> $W/steps.log
}
export -f job; export W start deadline
printf '%s\n' "$@" | xargs -P $workers -I{} bash -c 'job {}'
cat $W/steps.log
