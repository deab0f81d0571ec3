# After the raw-state staged solve landed with its re-tuned K-last bf16 tables
# (docs/perf/h100-h200-2026-11-25-retune-staged.md): the out-of-sample check of those tables and
# of the retimed B = 1 cells, on the GPU this runs on. From the repo root of main's tree on the
# device:   source .devbundle/setup.sh; bash docs/perf/raw/kl-bf16-landed/run.sh RES DEADLINE_S
#  1. the repeats: the H100 V-last bf16 T = 1, HV 32, B = 32 cell that read +11% once, and the
#     two B = 1 cells whose dispatch the retimes changed (K-last fp32 T = 2 verify, HV 16;
#     V-last fp32 T = 1, HV 32), each in its own process; then the four K-last bf16 cells the
#     re-tune timed disturbed;
#  2. if .devbundle/tree-nt.tar.gz travelled with the call (git archive of wip-norm-threads):
#     that branch's head-owning norm kernels at ilp 4 and 2 against ilp 8 in the fused core
#     (its docs/perf/raw/norm-threads/compare.py);
#  3. the TP grid's K-last bf16 cells, T 1/2/4/8, update and verify, B 1/32/512, beside
#     FlashInfer and FLA (bench_grid.sh, 8 jobs at a time), with the time left but 240 s;
#  4. K-last fp16 re-tuned (its one-pass staged kernel changed code with the same variants, so
#     the file's timings stay fresh by hash but were taken on the old code), if 200 s are left.
res=$1; deadline=$2; mkdir -p $res; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
export GDNGEN_CACHE_DIR=/tmp/gc-landed
bn() { timeout -s TERM $(left) python -m gdngen bench --qk-heads $2 --hv $3 --layout ${4%/*} \
    --state-dtype ${4#*/} --tokens $5 --mode $6 --batch $7 --variants ${8:-contenders} --contender-margin 0.05 \
    --peers none --out $res/repeat-$1 > $res/repeat-$1.log 2>&1; step "repeat $1 rc=$?"; }
for r in 1 2; do
  bn vl-bf16-t1-hv32-b32-$r 16 32 v_last/bf16 1 update 32
  bn kl-fp32-t2v-hv16-b1-$r 8 16 k_last/fp32 2 verify 1
  bn vl-fp32-t1-hv32-b1-$r 16 32 v_last/fp32 1 update 1
done
# the four cells the re-tune timed disturbed (h100-h200-2026-11-25-retune-staged.md), once each,
# beside every candidate (their disturbed timings put the true contenders out of the margin)
bn kl-bf16-t1-hv4-b256 2 4 k_last/bf16 1 update 256 candidates
bn kl-bf16-t2-hv4-b512 2 4 k_last/bf16 2 update 512 candidates
bn kl-bf16-t2-hv32-b256 16 32 k_last/bf16 2 update 256 candidates
bn kl-bf16-t2v-hv48-b256 16 48 k_last/bf16 2 verify 256 candidates
if [ -e .devbundle/tree-nt.tar.gz ]; then
  rm -rf /tmp/nt && mkdir /tmp/nt && tar -xzf .devbundle/tree-nt.tar.gz -C /tmp/nt
  # the branch's tree first on the path: setup.sh put this tree's root there
  ( cd /tmp/nt && PYTHONPATH=/tmp/nt:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-nt timeout -s TERM $(left) \
    python docs/perf/raw/norm-threads/compare.py $res/norm-threads.jsonl > $res/norm-threads.log 2>&1
    step "norm-threads rc=$?" )
fi
L=$(( $(left) - 240 )); step "grid with $L s"
if [ $L -gt 90 ]; then
  MARGIN=0.01 bash docs/perf/raw/tp-bench-t/bench_grid.sh $res/grid $L 8 \
    16:32,48,64:k_last/bf16:8:update,verify 8:24:k_last/bf16:8:update,verify \
    4:12,16:k_last/bf16:8:update,verify 2:4,6,8:k_last/bf16:8:update,verify \
    16:32,48,64:k_last/bf16:4:update,verify 8:24:k_last/bf16:4:update,verify \
    4:12,16:k_last/bf16:4:update,verify 2:4,6,8:k_last/bf16:4:update,verify \
    16:32,48,64:k_last/bf16:1,2:update,verify 8:24:k_last/bf16:1,2:update,verify \
    4:12,16:k_last/bf16:1,2:update,verify 2:4,6,8:k_last/bf16:1,2:update,verify
fi
L=$(left); step "fp16 tune with $L s"
if [ $L -gt 200 ]; then
  bash docs/perf/raw/h100-tune/tune.sh 8 $L k_last/fp16:8:32,48,64:128 k_last/fp16:8:4,6,8,12,16,24:128 \
    k_last/fp16:4::128 k_last/fp16:2::128 k_last/fp16:1::128 > $res/fp16-tune.log 2>&1
  step "fp16 tune rc=$?"; cp -r /tmp/rt $res/rt-fp16
fi
step done
