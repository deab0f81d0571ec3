#!/bin/bash
# The form rules, B = 1 and T = 3 through the dispatch (packed_forms.py), two rounds. usage: bash t3.sh RES DEADLINE
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-packed/packed_forms.py; export GDNGEN_CACHE_DIR=/tmp/gc-t3
CELLS="128,2,bf16;512,2,bf16;128,8,bf16;256,8,bf16;1,2,bf16;1,8,bf16;1,3,bf16;128,3,bf16;512,3,bf16;1,3,fp32;128,3,fp32"
IFS=';' read -ra cells <<< "$CELLS"
for c in "${cells[@]}"; do PACKED_CELLS="$c" timeout 200 python $P /dev/null compile > /dev/null 2>> "$res/compile.err" & done
wait; step compiled
for r in 1 2; do PACKED_CELLS="$CELLS" timeout $(left) python $P "$res/forms-$r.jsonl" > /dev/null 2> "$res/forms-$r.err"; step "round $r rc=$?"; done
