#!/bin/bash
# the variant tests over every GPU: the collected ids dealt round-robin, one pytest per GPU
res=$1; lim=$2; mkdir -p $res; gpus=$(nvidia-smi -L | wc -l)
python -m pytest -q -p no:cacheprovider --collect-only tests/gpu/test_variants_gpu.py 2>/dev/null | grep '::' > $res/ids.txt
for (( g = 0; g < gpus; g++ )); do
  awk -v g=$g -v n=$gpus 'NR % n == g' $res/ids.txt > $res/ids-$g.txt
  ( CUDA_VISIBLE_DEVICES=$g GDNGEN_CACHE_DIR=/tmp/gc-tests timeout $lim python -m pytest -q -p no:cacheprovider -n 3 -rf \
      $(cat $res/ids-$g.txt) > $res/variants-$g.log 2>&1; echo "gpu $g rc=$? $(tail -n 1 $res/variants-$g.log)" >> $res/steps.log ) &
done
wait; wc -l $res/ids*.txt >> $res/steps.log
