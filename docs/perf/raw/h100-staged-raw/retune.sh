# Re-measure the K-last bf16 set of branch wip-staged-raw's spec (its new variant makes the
# committed cells stale) on the GPU of the device machine: every T and HV of the grid, in jobs
# small enough that one cut off at the deadline loses few cells (a cut-off job writes none).
# Head dims 128 only (the new variant is built for them; the 64 and 256 sets stay valid).
# T = 8 first: its jobs are the longest. Run from the repo root of main's tree, with the branch
# carried as .devbundle/tree-sr.tar.gz (git archive of wip-staged-raw):
#   source .devbundle/setup.sh; setsid nohup bash docs/perf/raw/h100-staged-raw/retune.sh 1500 &
# then merge the per-job files into the branch's tuning file of that GPU model:
#   gdngen merge-tuning specs/h200.yaml specs/h200.tuning.h100.yaml rt/*.yaml   (H100)
#   gdngen merge-tuning specs/h200.yaml specs/h200.tuning.yaml rt/*.yaml        (H200)
deadline=${1:-1500}
rm -rf /tmp/sr /tmp/rt && mkdir /tmp/sr && tar -xzf .devbundle/tree-sr.tar.gz -C /tmp/sr
cd /tmp/sr && export GDNGEN_CACHE_DIR=/tmp/gc-sr
bash docs/perf/raw/h100-tune/tune.sh 8 $deadline \
  k_last/bf16:8:64:128 k_last/bf16:8:48:128 k_last/bf16:8:32:128 k_last/bf16:8:24:128 k_last/bf16:8:16:128 \
  k_last/bf16:8:12:128 k_last/bf16:8:8:128 k_last/bf16:8:4,6:128 \
  k_last/bf16:4:32,48,64:128 k_last/bf16:4:16,24:128 k_last/bf16:4:4,6,8,12:128 \
  k_last/bf16:2:24,32,48,64:128 k_last/bf16:2:4,6,8,12,16:128 k_last/bf16:1::128
