# Bench the dispatched call (the H100 table) beside its contenders and the peers, one process
# per layout/dtype taking turns on the GPU (--gpu-lock); each writes OUT/<tag>.json and .md.
# usage: bash docs/perf/raw/h100-tune/bench.sh OUT DEADLINE_S TOKENS HV
out=$1; deadline=$2; tokens=$3; hv=$4
mkdir -p $out
for pair in k_last:bf16 k_last:fp32 v_last:bf16 v_last:fp32; do
  layout=${pair%:*}; dtype=${pair#*:}; tag=$layout-$dtype-t${tokens//,/_}
  timeout $deadline python -m gdngen bench --tokens $tokens --hv $hv --layout $layout \
    --state-dtype $dtype --variants contenders --peers flashinfer,fla --gpu-lock /tmp/bench.lock \
    --out $out/$tag > $out/$tag.log 2>&1 &
done
wait
