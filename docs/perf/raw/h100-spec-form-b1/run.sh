# One device call for the spec form's B = 1 levers (issue 18): builds side by side, each a tree
# unpacked at /tmp/<name> with its own kernel cache, the first being main's.
#   1. the GPU tests of every build but the first, while packed_forms.py compiles: TESTS (default
#      the engine-form, conv and gated-norm files), run TEST_WORKERS at a time by pytest-xdist
#      (on the device image);
#   2. packed_forms.py on each build in turn, ROUNDS rounds (timings from one GPU, alternating);
#   3. with what is left of DEADLINE_S, the TP grid jobs given after the trees (bench_grid.sh,
#      from the first tree).
# usage: bash run.sh RES DEADLINE_S "main new ..." [JOB...]
# (session 26 ran it as `run.sh /tmp/res 1500 "old new" <jobs>`, tests one at a time)
res=$1; deadline=$2; trees=($3); shift 3
mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-packed/packed_forms.py
step tests+compile
for name in "${trees[@]:1}"; do
  ( cd /tmp/$name && GDNGEN_CACHE_DIR=/tmp/gc-$name python -m pytest -q -m gpu -p no:cacheprovider \
      -n ${TEST_WORKERS:-6} ${TESTS:-tests/gpu/test_engine_forms_gpu.py tests/gpu/test_conv_gpu.py \
      tests/gpu/test_gated_norm_gpu.py} > "$res/$name-tests.log" 2>&1; step "$name tests rc=$?" ) &
done
for name in "${trees[@]}"; do
  ( cd /tmp/$name && GDNGEN_CACHE_DIR=/tmp/gc-$name python $P /dev/null compile > "$res/$name-compile.log" 2>&1 ) &
done
wait
for r in $(seq ${ROUNDS:-2}); do
  for name in "${trees[@]}"; do
    step "$name-$r"
    ( cd /tmp/$name && GDNGEN_CACHE_DIR=/tmp/gc-$name python $P "$res/$name-$r.jsonl" > /dev/null 2> "$res/$name-$r.err" )
  done
done
left=$(( deadline - ($(date +%s) - start) ))
step "grid with $left s"
if [ $# -gt 0 ] && [ $left -gt 90 ]; then
  cd /tmp/${trees[0]} && GDNGEN_CACHE_DIR=/tmp/gc-${trees[0]} MARGIN=0.01 \
    bash docs/perf/raw/tp-bench-t/bench_grid.sh "$res/grid" $left 8 "$@"
fi
step done
