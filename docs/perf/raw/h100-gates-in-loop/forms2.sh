#!/bin/bash
# The cells forms.sh did not finish: bf16 B 128/512 (T 2, 4, 8) on GPU 0, fp32 B 512 (T 4, 8) on GPU 1.
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
lane() {  # GPU DTYPE BATCHES TOKENS
  export CUDA_VISIBLE_DEVICES=$1 GDNGEN_CACHE_DIR=/tmp/gc-forms-$1
  timeout $(left) python -m gdngen.bench.forms --out "$res/spec-$2" --tables spec --dtypes $2 --batches $3 --tokens $4 > "$res/spec-$2.log" 2>&1
  echo "$(date +%T) spec $2 rc=$?" >> "$res/steps.log"
}
lane 0 bf16 128,512 2,4,8 & lane 1 fp32 512 4,8 & wait
