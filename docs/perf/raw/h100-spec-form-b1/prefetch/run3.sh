# session 32 call 3, one H100: L2 prefetches of a uniform row's tokens and slot row (new) against
# HEAD (old): GPU tests of new beside the compiles, then slot_patterns.py x2 and packed_forms.py.
# old: scratch/s32/head.tar.xz was `git archive af2ca6b gdngen generated | xz`; new: af2ca6b with
# l2-prefetch.diff applied.  usage: bash run3.sh RES DEADLINE
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
S=docs/perf/raw/h100-spec-form-b1/slot_patterns.py
P=docs/perf/raw/h100-packed/packed_forms.py
rm -rf /tmp/t-old /tmp/t-new && mkdir -p /tmp/t-old /tmp/t-new
cp -r gdngen generated docs /tmp/t-new/ && cp -r docs /tmp/t-old/ && tar -xJf scratch/s32/head.tar.xz -C /tmp/t-old
( GDNGEN_CACHE_DIR=/tmp/gc-tests timeout 300 python -m pytest -q -p no:cacheprovider -n 4 \
    tests/gpu/test_engine_forms_gpu.py tests/gpu/test_gated_norm_gpu.py > "$res/tests.log" 2>&1
  step "tests rc=$? $(tail -n 1 "$res/tests.log")" ) &
tests=$!
export FORMS=pos_dense,pos_packed,spec,spec_dense
for w in old new; do
  for i in 0 1 2 3 4; do
    ( cd /tmp/t-$w && PYTHONPATH=/tmp/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$w \
        python $S /dev/null compile $i > "$res/compile-$w-$i.log" 2>&1 ) &
  done
  ( cd /tmp/t-$w && PYTHONPATH=/tmp/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$w \
      python $P /dev/null compile > "$res/compile-$w-packed.log" 2>&1 ) &
done
wait $(jobs -p | grep -vx "$tests")
step "compiled: $(cat "$res"/compile-*.log | grep -c compiled)"
wait $tests
run() {  # TREE SCRIPT OUT
  ( cd /tmp/t-$1 && PYTHONPATH=/tmp/t-$1:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$1 \
      timeout $(left) python $2 "$res/$3" > /dev/null 2> "$res/$3.err" )
  step "$1 $3 rc=$?"
}
for r in 1 2; do for w in old new; do run $w $S slots-$w-$r.jsonl; done; done
for w in old new; do run $w $P packed-$w-1.jsonl; done
step done
