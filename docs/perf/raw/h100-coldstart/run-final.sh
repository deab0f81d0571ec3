# The final device call behind docs/perf/h100-2026-11-23-coldstart.md (bundles a and b): build the
# h200 artifacts, then first calls (JIT, disk cache, artifacts), the 80-shape warm-up and the
# JIT-vs-loaded kernel times under CUDA graphs, each in fresh processes. Logs under $OUT.
set -u
source .devbundle/setup.sh
S=docs/perf/raw/h100-coldstart/coldstart.py
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
( time python -m gdngen build specs/h200.yaml --no-check --jobs 16 --out /tmp/art ) > $OUT/build.log 2>&1
tail -n 4 $OUT/build.log
{
  GDNGEN_DISK_CACHE=0 python $S first-call jit
  GDNGEN_CACHE_DIR=/tmp/c1 python $S first-call jit+store
  for i in 1 2 3; do GDNGEN_CACHE_DIR=/tmp/c1 python $S first-call cache; done
  for i in 1 2 3; do GDNGEN_DISK_CACHE=0 GDNGEN_ARTIFACTS=/tmp/art python $S first-call aot; done
  for i in 1 2 3; do GDNGEN_DISK_CACHE=0 GDNGEN_ARTIFACTS=/tmp/art python $S warmup; done
  GDNGEN_DISK_CACHE=0 GDNGEN_ARTIFACTS=/tmp/art python $S graphs
} 2> $OUT/measure.err | tee $OUT/measure.jsonl
tail -n 3 $OUT/measure.err
