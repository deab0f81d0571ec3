# Bench the TP shards at T = 1 (K-last, bf16 and fp32 state, update) beside FlashInfer and FLA,
# with the variants the tuning timed within 3% of each cell's best (`--variants contenders`), on
# the GPU this runs on. One process per TP degree and state dtype, taking turns on the GPU
# (--gpu-lock); each writes OUT/h<H>-<dtype>.jsonl as cells finish.
# usage: bash bench_shards.sh OUT DEADLINE_S
out=$1; deadline=$2; mkdir -p $out
for spec in "8 16,24,32" "4 8,12,16" "2 4,6,8"; do
  for dtype in bf16 fp32; do
    set -- $spec
    timeout $deadline python -m gdngen bench --tokens 1 --qk-heads $1 --hv $2 --layout k_last \
      --state-dtype $dtype --batch 1,4,16,64,256,512 --variants contenders --contender-margin 0.03 \
      --peers flashinfer,fla --gpu-lock /tmp/bench.lock --out $out/h$1-$dtype \
      > $out/h$1-$dtype.log 2>&1 &
  done
done
wait
