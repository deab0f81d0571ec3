# session 32 call 2b, one H100: the spec form's chains ablated (docs/perf/raw/h100-spec-form-b1/chains/ablate_rows.py) in
# tree copies, timed beside main by slot_patterns.py.  usage: bash run2.sh RES DEADLINE
res=$1; deadline=$2; mkdir -p "$res"; start=$(date +%s)
step() { echo "$(date +%T) +$(( $(date +%s) - start ))s $*" >> "$res/steps.log"; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$res/gpu.txt"
P=docs/perf/raw/h100-spec-form-b1/slot_patterns.py
export FORMS=pos_dense,pos_packed,spec,spec_dense
trees="main tok slot both"
for w in $trees; do
  rm -rf /tmp/t-$w && mkdir -p /tmp/t-$w && cp -r gdngen generated docs /tmp/t-$w/
  [ $w = main ] || python docs/perf/raw/h100-spec-form-b1/chains/ablate_rows.py /tmp/t-$w $w >> "$res/steps.log"
done
for w in $trees; do for i in 0 1 2 3 4; do
  ( cd /tmp/t-$w && PYTHONPATH=/tmp/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$w \
      python $P /dev/null compile $i > "$res/compile-$w-$i.log" 2>&1 ) &
done; done
wait
step "compiled: $(cat "$res"/compile-*.log | grep -c compiled) of 20"
for r in 1 2; do for w in $trees; do
  ( cd /tmp/t-$w && PYTHONPATH=/tmp/t-$w:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-$w \
      timeout $(left) python $P "$res/$w-$r.jsonl" > /dev/null 2> "$res/$w-$r.err" )
  step "$w round $r rc=$?"
done; done
step done
