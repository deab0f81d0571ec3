#!/usr/bin/env bash
# The head-dim candidates on a GPU, in one device call (docs/design.md, "Head dims"): every
# K != 128 variant of generated/h200 against the float64 reference, then both head dims benched
# beside FLA with all their candidates side by side. Run from the repository root:
#
#     bash docs/perf/raw/head-dim-candidates/run.sh OUT [DEADLINE_SECONDS]
#
# OUT receives the test log, one bench record and table per head dim, and gpu.txt.
set -u
out=${1:?usage: run.sh OUT [DEADLINE_SECONDS]}
deadline=${2:-560}
mkdir -p "$out"
# One kernel cache for the tests and both benches (its writes are atomic): a later tune in the
# same machine finds their kernels compiled.
export GDNGEN_CACHE_DIR=${GDNGEN_CACHE_DIR:-/tmp/gdngen-hd}
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > "$out/gpu.txt"
start=$SECONDS
left() { echo $((deadline - (SECONDS - start))); }

# The variants of other head dims than 128 (HEAD_K_DIM in each module).
others=$(python - <<'PY'
import generated.h200 as h200
from generated.h200.kernels import VARIANTS
print(" or ".join(v for v in VARIANTS if h200.variant(v).module(v).HEAD_K_DIM != 128))
PY
)
timeout $(( $(left) / 3 )) \
  python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_variants_gpu.py -k "$others" \
  > "$out/variant-tests.log" 2>&1
echo "tests rc=$?" >> "$out/variant-tests.log"

bench() {
  python -m gdngen bench --head-dim "$1" --qk-heads 16 \
    --hv 32 --tokens 1,2,4,8 --batch 1,32,128,512 --layout k_last,v_last \
    --state-dtype bf16,fp32 --mode update --variants candidates --gpu-lock /tmp/gdngen-hd.lock \
    --out "$out/hd$1" > "$out/hd$1.log" 2>&1
}
budget=$(left)
(timeout "$budget" bash -c "$(declare -f bench); out=$out; bench 64") &
(timeout "$budget" bash -c "$(declare -f bench); out=$out; bench 256") &
wait
tail -n 2 "$out"/*.log
