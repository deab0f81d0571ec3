#!/bin/bash
# B = 8, the one batch of the bench's default list the other runs left out: bf16 on GPU 0, fp32 on GPU 1.
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
lane() {  # GPU DTYPE
  export CUDA_VISIBLE_DEVICES=$1 GDNGEN_CACHE_DIR=/tmp/gc-forms-$1
  timeout $(left) python -m gdngen.bench.forms --out "$res/spec-$2" --tables spec --dtypes $2 --batches 8 --tokens 2,4,8 > "$res/spec-$2.log" 2>&1
  echo "$(date +%T) spec $2 rc=$?" >> "$res/steps.log"
}
lane 0 bf16 & lane 1 fp32 & wait
