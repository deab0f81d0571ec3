# Bench the TP shards at T=1 (K-last, bf16 and fp32) beside FlashInfer and FLA, one process per
# TP degree taking turns on the GPU. usage: bash bench_shards.sh OUT DEADLINE_S
out=$1; deadline=$2; mkdir -p $out
for spec in "8 16,24,32" "4 8,12,16" "2 4,6,8"; do
  set -- $spec
  timeout $deadline python -m gdngen bench --tokens 1 --qk-heads $1 --hv $2 --layout k_last \
    --state-dtype bf16,fp32 --variants none --peers flashinfer,fla --gpu-lock /tmp/bench.lock \
    --out $out/h$1 > $out/h$1.log 2>&1 &
done
wait
