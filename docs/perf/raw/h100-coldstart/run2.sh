# Second device session: first calls after the version lookup fix (bundles a and b), then, in a
# call right after (bundle c), the eager host cost beside FlashInfer, FLA and a bare torch op.
# Usage: bash docs/perf/raw/h100-coldstart/run2.sh first|eager
set -u
source .devbundle/setup.sh
S=docs/perf/raw/h100-coldstart/coldstart.py
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ "$1" = first ]; then
  {
    GDNGEN_CACHE_DIR=/tmp/c2 python $S first-call jit+store
    for i in 1 2 3; do GDNGEN_CACHE_DIR=/tmp/c2 python $S first-call cache; done
    rm -rf /tmp/art2 && cp -r /tmp/c2 /tmp/art2   # an artifact dir has the cache's layout
    for i in 1 2 3; do GDNGEN_DISK_CACHE=0 GDNGEN_ARTIFACTS=/tmp/art2 python $S first-call aot; done
    GDNGEN_CACHE_DIR=/tmp/c2 python $S first-call-profile
  } 2> $OUT/first.err | tee $OUT/first.jsonl
  grep -A 30 "cumulative" $OUT/first.err | head -40
else
  GDNGEN_CACHE_DIR=/tmp/c2 python $S eager 2> $OUT/eager.err | tee $OUT/eager.jsonl
  tail -n 5 $OUT/eager.err
fi
