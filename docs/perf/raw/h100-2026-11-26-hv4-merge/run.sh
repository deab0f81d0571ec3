# Session 32, two H100s of one host (GPU 0: slot_patterns.py; GPU $BENCH_GPU: the HV 4 bench).
# (1) slot_patterns.py compile (5 processes) beside the HV 4 bench on the merged table (the
# files scratch/s32/merged/ held are the committed specs/h200.tuning.h100.yaml and
# generated/h200/{dispatch.py,MANIFEST.txt} of this commit); (2) slot_patterns.py timing, two
# rounds.  usage: BENCH_GPU=1 bash run.sh RES DEADLINE
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-spec-form-b1/slot_patterns.py
export GDNGEN_CACHE_DIR=/tmp/gc-main
for i in 0 1 2 3 4; do CUDA_VISIBLE_DEVICES=0 python $P /dev/null compile $i > "$res/compile-$i.log" 2>&1 & done
# the HV 4 rule the retime drops: the merged table in a copy of the tree
rm -rf /tmp/merged && mkdir -p /tmp/merged && cp -r gdngen generated specs pyproject.toml /tmp/merged/
cp scratch/s32/merged/h200.tuning.h100.yaml /tmp/merged/specs/
cp scratch/s32/merged/{dispatch.py,MANIFEST.txt} /tmp/merged/generated/h200/
mkdir -p "$res/bench"
( cd /tmp/merged && for T in 2 3; do
    CUDA_VISIBLE_DEVICES=$BENCH_GPU PYTHONPATH=/tmp/merged:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-merged timeout $(( $(left) / 2 )) \
      python -m gdngen bench --qk-heads 2 --hv 4 --layout k_last --state-dtype bf16 --tokens $T \
      --mode update --batch 512 --variants contenders --contender-margin 0.03 \
      --peers flashinfer,fla --out "$res/bench/hv4-t$T-b512" > "$res/bench/hv4-t$T-b512.log" 2>&1
    step "bench T=$T rc=$?"
  done ) &
wait $(jobs -p | head -n 5)
step "compiled: $(grep -c compiled "$res"/compile-*.log | tr '\n' ' ')"
for r in 1 2; do
  CUDA_VISIBLE_DEVICES=0 timeout $(left) python $P "$res/slots-$r.jsonl" > /dev/null 2> "$res/slots-$r.err"
  step "slots round $r rc=$?"
done
wait; step done
