# Tune specs/h200.yaml on the GPU of the device machine, one process per job, WORKERS at a time,
# taking turns on the GPU (--gpu-lock); each writes its own file under RT_DIR (default /tmp/rt;
# one per GPU where two tune at once), merged later
# with `gdngen merge-tuning specs/h200.yaml SPEC_TUNING_FILE /tmp/rt/*.yaml` (which writes the
# running GPU model's tuning file, e.g. specs/h200.tuning.h100.yaml).
# usage: bash docs/perf/raw/h100-tune/tune.sh WORKERS DEADLINE_S job...
#   job = layout/dtype:T, or layout/dtype:T:HVs to measure only those HVs of tuning.heads
#   (e.g. k_last/bf16:2:4,6,8,12): a long job split by HV finishes within a call's time.
#   T may list several (1,2,4,8: T = 1 first, whose cells shortlist the others). A fourth field
#   names head dims of tuning.head_dims (k_last/fp32:1,2,4,8::256 measures K = V = 256 at its
#   geometry's HV); without it, the base head dims and every one of tuning.head_dims.
# SHORTLIST_FROM=FILE (environment): each job starts from a copy of FILE (the GPU model's
#   committed tuning file) and runs with --merge, so its T > 1 cells time only the variants its
#   T = 1 cells shortlist (tuning.multi_token_shortlist) instead of every candidate. Only for
#   jobs that measure cells FILE lacks: merge-tuning keeps the last file's copy of a cell.
set -o pipefail
workers=$1; deadline=$2; shift 2
W=${RT_DIR:-/tmp/rt}; mkdir -p $W
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee -a $W/gpu.txt
start=$(date +%s)
job() {
  IFS=: read -r pair T heads dims <<< "$1"
  tag=${pair/\//-}-t${T//,/-}${heads:+-hv${heads//,/-}}${dims:+-hd${dims//,/-}}
  s=$(date +%s)
  merge=
  if [ -n "$SHORTLIST_FROM" ]; then cp "$SHORTLIST_FROM" $W/$tag.yaml; merge=--merge; fi
  timeout $(( deadline - (s - start) - 15 )) python -m gdngen tune specs/h200.yaml --pairs $pair \
    --tokens $T ${heads:+--heads $heads} ${dims:+--head-dims $dims} --gpu-lock $W/gpu.lock $merge --out $W/$tag.yaml > $W/$tag.log 2>&1
  echo "$1 rc=$? $(( $(date +%s) - s )) s (started at +$(( s - start )) s)" >> $W/steps.log
}
export -f job; export W start deadline SHORTLIST_FROM
printf '%s\n' "$@" | xargs -P $workers -I{} bash -c 'job {}'
cat $W/steps.log
