# One H100: form_sweep.py, one compile process a cell, then the timing.  usage: bash run4.sh RES
res=$1; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
F=docs/perf/raw/h100-spec-form-b1/form_sweep.py
export GDNGEN_CACHE_DIR=/tmp/gc-sweep
for i in 0 1 2 3 4 5; do timeout 150 python $F /dev/null compile $i > "$res/compile-$i.log" 2>&1 & done
wait
step "compiled: $(grep -h compiled "$res"/compile-*.log | tr '\n' ';')"
timeout 130 python $F "$res/sweep.jsonl" > "$res/sweep.log" 2>&1
step "sweep rc=$?"
