# usage: bash .devbundle/retune.sh WORKERS DEADLINE_S job...   (job = layout/dtype:T)
set -o pipefail
source .devbundle/setup.sh
workers=$1; deadline=$2; shift 2
W=/tmp/rt; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $W/gpu.txt
start=$(date +%s)
job() {  # one pair, one T, its own file; GPU work in turns with the other jobs
  pair=${1%:*}; T=${1#*:}; tag=${pair/\//-}-t$T
  s=$(date +%s)
  timeout $(( deadline - (s - start) - 15 )) python -m gdngen tune specs/h200.yaml --pairs $pair --tokens $T \
    --gpu-lock $W/gpu.lock --out $W/$tag.yaml > $W/$tag.log 2>&1
  echo "$pair T=$T rc=$? $(( $(date +%s) - s )) s (started at +$(( s - start )) s)" >> $W/steps.log
}
export -f job; export W start deadline
printf '%s\n' "$@" | xargs -P $workers -I{} bash -c 'job {}'
cat $W/steps.log
tar czf $OUT/retune.tgz -C $W .
