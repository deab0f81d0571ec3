# As run on 2026-11-25 (docs/perf/h100-2026-11-25-staged-raw.md and, for lever 4,
# h100-2026-11-25-spec-form-b1.md), from the repo root of main's tree on the device, with the
# branch trees carried as .devbundle/tree-{sf,sfx,sfs}.tar.gz (git archive of wip-state-first,
# wip-state-first-exact, wip-state-first-staged):  bash run-1.sh /tmp/res 1400
# Its steps 1 and 2 ran (step 1's tests hit CUDA out-of-memory: 10 pytest workers and 3 builds
# on one GPU). run-2.sh stopped it at the start of the second packed round and did the rest.
# Session 27 device run (one H100): state-first branches (issue 18) + staged raw (issue 19)
# + H lead for HV16 B1 (issue 19) + leftover TP grid. usage: bash dev27.sh RES DEADLINE_S
res=$1; deadline=$2; mkdir -p $res; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
rm -rf /tmp/main /tmp/sf /tmp/sfx /tmp/sfs
cp -r . /tmp/main
for n in sf sfx sfs; do mkdir /tmp/$n && tar -xzf .devbundle/tree-$n.tar.gz -C /tmp/$n; done
step unpacked
P=docs/perf/raw/h100-packed/packed_forms.py
# 1. GPU tests of sf (wide) and sfs (variants + call), while packed_forms compiles on 3 trees
( cd /tmp/sf && GDNGEN_CACHE_DIR=/tmp/gc-sf python -m pytest -q -m gpu -p no:cacheprovider -n 6 \
   tests/gpu/test_engine_forms_gpu.py tests/gpu/test_variants_gpu.py tests/gpu/test_call_gpu.py \
   tests/gpu/test_conv_gpu.py tests/gpu/test_gated_norm_gpu.py > $res/sf-tests.log 2>&1; step "sf tests rc=$?" ) &
( cd /tmp/sfs && GDNGEN_CACHE_DIR=/tmp/gc-sfs python -m pytest -q -m gpu -p no:cacheprovider -n 4 \
   tests/gpu/test_variants_gpu.py tests/gpu/test_call_gpu.py > $res/sfs-tests.log 2>&1; step "sfs tests rc=$?" ) &
for n in main sf sfx; do
  ( cd /tmp/$n && GDNGEN_CACHE_DIR=/tmp/gc-$n python $P /dev/null compile > $res/$n-compile.log 2>&1 ) &
done
wait; step tests+compile done
# 2. packed forms, alternating builds
for r in 1 2; do for n in main sf sfx; do
  step "packed $n-$r"
  ( cd /tmp/$n && GDNGEN_CACHE_DIR=/tmp/gc-$n python $P $res/packed-$n-$r.jsonl > /dev/null 2> $res/packed-$n-$r.err )
done; done
# 3. staged: main's staged variant vs sfs's plain and occ2 staged, T 4/8, B 32/128/512
bs() { # tree tag H HVs variants
  ( cd /tmp/$1 && GDNGEN_CACHE_DIR=/tmp/gc-$1 timeout -s TERM $(left) python -m gdngen bench --qk-heads $3 --hv $4 \
     --layout k_last --state-dtype bf16 --tokens 4,8 --mode update --batch 32,128,512 --variants $5 \
     --peers flashinfer --out $res/staged-$2 > $res/staged-$2.log 2>&1; step "staged $2 rc=$?" ) ; }
M=kl_bf16_tv128_ilp8_vec8_tpg16_staged_sm90
O=kl_bf16_tv128_ilp8_vec8_tpg16_occ2_staged_sm90
step staged
bs main main-h8 8 24,32 $M; bs sfs sfs-h8 8 24,32 $M,$O; bs main main-h16 16 64 $M; bs sfs sfs-h16 16 64 $M,$O
# 4. H lead: HV16 fp32 T2 verify B1 at H 8 and 4, every candidate, twice alternating
for r in 1 2; do for H in 8 4; do
  ( cd /tmp/main && GDNGEN_CACHE_DIR=/tmp/gc-main timeout -s TERM $(left) python -m gdngen bench --qk-heads $H --hv 16 \
     --layout k_last --state-dtype fp32 --tokens 2 --mode verify --batch 1 --variants contenders --contender-margin 0.05 --peers none \
     --out $res/hlead-h$H-$r > $res/hlead-h$H-$r.log 2>&1; step "hlead h$H-$r rc=$?" )
done; done
# 5. grid, remaining time
L=$(left); step "grid with $L s"
if [ $L -gt 90 ]; then
  cd /tmp/main && GDNGEN_CACHE_DIR=/tmp/gc-main MARGIN=0.01 bash docs/perf/raw/tp-bench-t/bench_grid.sh $res/grid $L 8 \
    2:4,6,8:v_last/bf16:1,2:update 4:12,16:v_last/bf16:1,2:update 8:24:v_last/bf16:1,2:update \
    16:32,48:v_last/bf16:1,2:update 2:4,6,8:v_last/bf16:4,8:update 4:12,16:v_last/bf16:4,8:update \
    8:24:v_last/bf16:4,8:update 16:32,48:v_last/bf16:4,8:update 4:12,16:k_last/fp16:4,8:update \
    8:24:k_last/fp16:4,8:update 16:32,48:k_last/fp16:4,8:update
fi
step done
