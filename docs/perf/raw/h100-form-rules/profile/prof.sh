#!/bin/bash
# Nsight Compute's stall samples of the B = 1 forms at T = 8 and 2, bf16 (profile_many.py), on
# one GPU. usage: bash prof.sh RES   (from the repository root, after the bundles' setup)
# On 2026-11-27 the warm-up ran in one call and the two profiles in the next, on the same machine.
res=$1; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
step "ncu: $NCU"; nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader > "$res/gpu.txt"
export GDNGEN_CACHE_DIR=/tmp/gc-prof
# the kernels compiled first, outside the profiler (each form once)
for T in 8 2; do timeout 200 python "$here/profile_many.py" $T bf16 0 > /dev/null 2> "$res/warm-$T.log" & done
wait; step warmed
for T in 8 2; do
  timeout 200 $NCU --clock-control none --kernel-name regex:decode_kernel --launch-skip 0 \
    --section WarpStateStats --section SourceCounters --section LaunchStats \
    --warp-sampling-interval 0 --page source --print-source sass --csv \
    python "$here/profile_many.py" $T bf16 6 2> "$res/ncu-$T.err" | gzip > "$res/src-t$T.csv.gz"
  step "ncu T=$T rc=${PIPESTATUS[0]}"
done
