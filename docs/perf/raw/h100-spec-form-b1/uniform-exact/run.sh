# One device call on an H100 (after the call that carries .devbundle), from the root of main's
# tree with uniform-exact.diff applied and every target re-emitted (README.md, step 1), carrying
# .devb2 and scratch/ (scratch/head.tar.xz: `git archive HEAD gdngen generated | xz`, the tree
# without the diff).
#   1. the engine-form GPU tests of the patched tree, two workers (three, beside packed_forms.py's
#      compile, ran out of memory on 2026-11-26: prefetch/tests-tail.txt), beside the compiles;
#   2. slot_patterns.py (four forms) on both trees, two rounds, alternating; packed_forms.py once.
# Write RES under $OUT: a call that runs past its limit brings back only what is there.
# usage: source .devb2/setup.sh > /dev/null 2>&1; bash run.sh RES DEADLINE_S
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { local l=$(( deadline - ($(date +%s) - start) )); echo $(( l > 1 ? l : 1 )); }  # timeout 0 would mean none
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
S=docs/perf/raw/h100-spec-form-b1/slot_patterns.py
P=docs/perf/raw/h100-packed/packed_forms.py
rm -rf /tmp/t-old /tmp/t-new && mkdir -p /tmp/t-old /tmp/t-new
cp -r gdngen generated docs /tmp/t-new/ && cp -r docs /tmp/t-old/ && tar -xJf scratch/head.tar.xz -C /tmp/t-old
export FORMS=pos_dense,pos_packed,spec,spec_dense
for w in old new; do  # the kernel caches fill beside the tests (small inputs: B <= 32)
  for i in 0 1 2 3 4; do
    ( cd /tmp/t-$w && PYTHONPATH=/tmp/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$w \
        python $S /dev/null compile $i > "$res/compile-$w-$i.log" 2>&1 ) &
  done
done
( GDNGEN_CACHE_DIR=/tmp/gc-tests timeout 240 python -m pytest -q -p no:cacheprovider -n 2 \
    tests/gpu/test_engine_forms_gpu.py > "$res/tests.log" 2>&1
  step "tests rc=$? $(tail -n 1 "$res/tests.log")" ) &
tests=$!
wait $(jobs -p | grep -vx "$tests")
step "compiled: $(cat "$res"/compile-*.log | grep -c compiled) of 10"
wait $tests
run() {  # TREE SCRIPT OUT
  ( cd /tmp/t-$1 && PYTHONPATH=/tmp/t-$1:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$1 \
      timeout $(left) python $2 "$res/$3" > /dev/null 2> "$res/$3.err" )
  step "$1 $3 rc=$?"
}
for r in 1 2; do for w in old new; do run $w $S slots-$w-$r.jsonl; done; done
for w in old new; do run $w $P packed-$w-1.jsonl; done
step done
