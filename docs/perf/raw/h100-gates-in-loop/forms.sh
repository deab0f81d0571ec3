#!/bin/bash
# gdngen.bench.forms on two GPUs: GPU 0 the bf16 spec table then bf16 mixed, GPU 1 fp32 likewise.
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
lane() {  # GPU DTYPE
  export CUDA_VISIBLE_DEVICES=$1 GDNGEN_CACHE_DIR=/tmp/gc-forms-$1
  timeout $(left) python -m gdngen.bench.forms --out "$res/spec-$2" --tables spec --dtypes $2 --batches 1,32,128,512 --tokens 2,4,8 > "$res/spec-$2.log" 2>&1
  echo "$(date +%T) spec $2 rc=$?" >> "$res/steps.log"
  timeout $(left) python -m gdngen.bench.forms --out "$res/mixed-$2" --tables mixed --dtypes $2 --batches 1,32,128,512 > "$res/mixed-$2.log" 2>&1
  echo "$(date +%T) mixed $2 rc=$?" >> "$res/steps.log"
}
lane 0 bf16 & lane 1 fp32 & wait
