# As run on 2026-11-25, started beside run-1.sh:  bash run-2.sh 990  (seconds it may take)
# It waits for run-1.sh's second packed round, stops it there, then: the failed tests again
# (4 workers), the staged kernels on main and on the branch, the H lead (HV 16 at H = 8 and 4),
# and the branch's failed tests again. (The sf rerun still ran out of memory: 4 workers.)
res=/tmp/res; end=$(( $(date +%s) + $1 )); left() { echo $(( end - $(date +%s) )); }
step() { echo "$(date +%T) w2: $*" >> $res/steps.log; }
until grep -q "packed main-2" $res/steps.log; do sleep 1; done
pkill -f "[d]ev27"; pkill -f "[p]acked_forms"; sleep 2; step "stopped before round 2"
cd /work/main; source .devbundle/setup.sh >/dev/null 2>&1
rerun() { ids=$(grep ^FAILED $res/$1-tests.log | cut -d' ' -f2 | sort -u)
  ( cd /tmp/$1 && GDNGEN_CACHE_DIR=/tmp/gc-$1 timeout $(left) python -m pytest -q -m gpu -p no:cacheprovider -n 4 $ids > $res/$1-rerun.log 2>&1; step "$1 rerun rc=$?" ) ; }
bs() { ( cd /tmp/$1 && GDNGEN_CACHE_DIR=/tmp/gc-$1 timeout -s TERM $(left) python -m gdngen bench --qk-heads $3 --hv $4 \
  --layout k_last --state-dtype bf16 --tokens 4,8 --mode update --batch 32,128,512 --variants $5 \
  --peers flashinfer --out $res/staged-$2 > $res/staged-$2.log 2>&1; step "staged $2 rc=$?" ) ; }
rerun sf
M=kl_bf16_tv128_ilp8_vec8_tpg16_staged_sm90; O=kl_bf16_tv128_ilp8_vec8_tpg16_occ2_staged_sm90
bs main main-h8 8 24,32 $M; bs sfs sfs-h8 8 24,32 $M,$O; bs main main-h16 16 64 $M; bs sfs sfs-h16 16 64 $M,$O
for H in 8 4; do ( cd /tmp/main && GDNGEN_CACHE_DIR=/tmp/gc-main timeout -s TERM $(left) python -m gdngen bench --qk-heads $H --hv 16 \
  --layout k_last --state-dtype fp32 --tokens 2 --mode verify --batch 1 --variants contenders --contender-margin 0.05 --peers none \
  --out $res/hlead-h$H > $res/hlead-h$H.log 2>&1; step "hlead h$H rc=$?" ); done
rerun sfs
step done
