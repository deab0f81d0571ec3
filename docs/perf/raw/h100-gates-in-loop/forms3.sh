#!/bin/bash
# fp32 B = 512, T = 8 (out of memory in forms2.sh's exactness check), on GPU 0.
res=$1; mkdir -p "$res"
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
CUDA_VISIBLE_DEVICES=0 GDNGEN_CACHE_DIR=/tmp/gc-forms3 timeout $2 python -m gdngen.bench.forms --out "$res/spec-fp32" --tables spec --dtypes fp32 --batches 512 --tokens 8 > "$res/spec-fp32.log" 2>&1
echo "$(date +%T) spec fp32 rc=$?" >> "$res/steps.log"
