# The device call behind docs/perf/h100-2026-11-23-coldstart.md (one H100, bundles a and b).
# Logs go to $OUT. Usage: bash docs/perf/raw/h100-coldstart/run.sh
set -u
source .devbundle/setup.sh
S=docs/perf/raw/h100-coldstart/coldstart.py
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
# GPU tests of the call path (their kernels go to a cache of their own)
GDNGEN_CACHE_DIR=/tmp/test-cache timeout 330 python -m pytest -q -p no:cacheprovider \
  tests/gpu/test_call_gpu.py tests/gpu/test_cold_start_gpu.py > $OUT/gpu-tests.log 2>&1
tail -n 15 $OUT/gpu-tests.log
# ahead-of-time artifacts of the whole h200 target (CPU only)
( time python -m gdngen build specs/h200.yaml --no-check --jobs 16 --out /tmp/art ) > $OUT/build.log 2>&1
tail -n 4 $OUT/build.log
{
  GDNGEN_DISK_CACHE=0 python $S first-call jit
  GDNGEN_CACHE_DIR=/tmp/c1 python $S first-call jit+store
  GDNGEN_CACHE_DIR=/tmp/c1 python $S first-call cache
  GDNGEN_DISK_CACHE=0 GDNGEN_ARTIFACTS=/tmp/art python $S first-call aot
  GDNGEN_DISK_CACHE=0 GDNGEN_ARTIFACTS=/tmp/art python $S warmup
  GDNGEN_DISK_CACHE=0 GDNGEN_ARTIFACTS=/tmp/art python $S graphs
} 2> $OUT/measure.err | tee $OUT/measure.jsonl
tail -n 5 $OUT/measure.err
