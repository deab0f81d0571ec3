# Session 28's H100 run, from the repo root of main's tree on the device, with branch
# wip-staged-raw carried as .devbundle/tree-sr.tar.gz and wip-core-stream as tree-cs.tar.gz
# (git archive of each):   source .devbundle/setup.sh; bash run.sh RES DEADLINE_S
#  1. the K-last bf16 head-dims-128 set of wip-staged-raw's spec tuned again (its new variant
#     makes those cells stale): docs/perf/raw/h100-staged-raw/retune.sh's jobs, 8 at a time;
#  2. tune against bench on one machine: the two B = 1 dispatch misses retimed with
#     `gdngen tune --retime`, then benched with their contenders, one process after the other;
#  3. the branch's GPU tests (staged variants, the call, the engine forms), 4 workers;
#  4. wip-core-stream's streamed fused-core kernel against the plain one (compare.py);
#  5. the TP grid's missing cells with the time left (bench_grid.sh).
res=$1; deadline=$2; mkdir -p $res; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
rm -rf /tmp/main /tmp/sr /tmp/cs /tmp/rt; cp -r . /tmp/main
for n in sr cs; do mkdir /tmp/$n && tar -xzf .devbundle/tree-$n.tar.gz -C /tmp/$n; done
step unpacked
# 1. retune (writes /tmp/rt/<job>.yaml per finished job)
( cd /tmp/sr && GDNGEN_CACHE_DIR=/tmp/gc-sr bash docs/perf/raw/h100-tune/tune.sh 8 $(( $(left) - 420 )) \
  k_last/bf16:8:64:128 k_last/bf16:8:48:128 k_last/bf16:8:32:128 k_last/bf16:8:24:128 k_last/bf16:8:16:128 \
  k_last/bf16:8:12:128 k_last/bf16:8:8:128 k_last/bf16:8:4,6:128 \
  k_last/bf16:4:32,48,64:128 k_last/bf16:4:16,24:128 k_last/bf16:4:4,6,8,12:128 \
  k_last/bf16:2:24,32,48,64:128 k_last/bf16:2:4,6,8,12,16:128 k_last/bf16:1::128 > $res/retune.log 2>&1 )
step "retune rc=$?"; cp -r /tmp/rt $res/rt
# 2. tune --retime, then bench, of the B = 1 misses (main's tree and H100 tuning file)
cd /tmp/main; export GDNGEN_CACHE_DIR=/tmp/gc-main
rt() { cp specs/h200.tuning.h100.yaml $res/retime-$1.yaml
  timeout $(left) python -m gdngen tune specs/h200.yaml --pairs $2 --tokens $3 --heads $4 --retime \
    --out $res/retime-$1.yaml > $res/retime-$1.log 2>&1; step "retime $1 rc=$?"; }
bn() { timeout -s TERM $(left) python -m gdngen bench --qk-heads $2 --hv $3 --layout ${4%/*} \
    --state-dtype ${4#*/} --tokens $5 --mode $6 --batch 1 --variants contenders --contender-margin 0.05 \
    --peers none --out $res/bench-$1 > $res/bench-$1.log 2>&1; step "bench $1 rc=$?"; }
rt kl-fp32-t2-hv16 k_last/fp32 2 16; bn kl-fp32-t2-hv16 8 16 k_last/fp32 2 verify
rt vl-fp32-hv6-32 v_last/fp32 1,2 6,32; bn vl-fp32-t2-hv6 2 6 v_last/fp32 2 update
bn vl-fp32-t1-hv32 16 32 v_last/fp32 1 update
# 3. the branch's GPU tests
( cd /tmp/sr && GDNGEN_CACHE_DIR=/tmp/gc-sr timeout $(left) python -m pytest -q -m gpu -p no:cacheprovider -n 4 \
   tests/gpu/test_variants_gpu.py -k "staged or occ2" > $res/sr-variants.log 2>&1; step "sr variants rc=$?" )
( cd /tmp/sr && GDNGEN_CACHE_DIR=/tmp/gc-sr timeout $(left) python -m pytest -q -m gpu -p no:cacheprovider -n 4 \
   tests/gpu/test_call_gpu.py tests/gpu/test_engine_forms_gpu.py > $res/sr-call.log 2>&1; step "sr call+forms rc=$?" )
# 4. core stream
( cd /tmp/cs && GDNGEN_CACHE_DIR=/tmp/gc-cs timeout -s TERM $(left) python docs/perf/raw/h100-core-stream/compare.py \
   $res/core-stream.jsonl > $res/core-stream.log 2>&1; step "core-stream rc=$?" )
# 5. grid
L=$(left); step "grid with $L s"
if [ $L -gt 90 ]; then
  MARGIN=0.01 bash docs/perf/raw/tp-bench-t/bench_grid.sh $res/grid $L 8 \
    2:4,6,8:v_last/bf16:1,2:update 4:12,16:v_last/bf16:1,2:update 8:24:v_last/bf16:1,2:update \
    16:32,48:v_last/bf16:1,2:update 2:4,6,8:v_last/bf16:4,8:update 4:12,16:v_last/bf16:4,8:update \
    8:24:v_last/bf16:4,8:update 16:32,48:v_last/bf16:4,8:update
fi
step done
