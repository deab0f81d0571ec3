# usage: bash .devbundle/bench.sh WORKERS DEADLINE_S job...   (job = layout/dtype:T)
set -o pipefail
source .devbundle/setup.sh
workers=$1; deadline=$2; shift 2
W=/tmp/bn; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $W/gpu.txt
start=$(date +%s)
job() {  # pair:T[:tag:extra args] - every HV/B/mode (or those of extra) beside the peers
  IFS=: read -r pair T suffix extra <<< "$1"; tag=${pair/\//-}-t$T$suffix
  s=$(date +%s)
  timeout $(( deadline - (s - start) - 15 )) python -m gdngen bench --tokens $T --hv 32,64 \
    --layout ${pair%/*} --state-dtype ${pair#*/} --mode update,verify --variants contenders $extra \
    --gpu-lock $W/gpu.lock --out $W/$tag > $W/$tag.log 2>&1
  echo "$pair T=$T rc=$? $(( $(date +%s) - s )) s (started at +$(( s - start )) s)" >> $W/steps.log
}
export -f job; export W start deadline
printf '%s\n' "$@" | xargs -P $workers -I{} bash -c 'job "$1"' _ {}
cat $W/steps.log
tar czf $OUT/bench.tgz -C $W .
