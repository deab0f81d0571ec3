# The device calls that followed run.sh on 2026-11-25, as run (each from the repo root of
# main's tree on the device, after `source .devbundle/setup.sh`).
#
# H100 (GPU-4291c0c4), after run.sh ended:
#  a. fp16 cells of the TP grid (K-last T 4/8, V-last T 1/2), 380 s:
cd /tmp/main && MARGIN=0.01 GDNGEN_CACHE_DIR=/tmp/gc-main bash docs/perf/raw/tp-bench-t/bench_grid.sh \
  /tmp/res/grid2 380 8 4:12,16:k_last/fp16:4,8:update 8:24:k_last/fp16:4,8:update \
  16:32,48:k_last/fp16:4,8:update 2:4,6,8:v_last/fp16:1,2:update 4:12,16:v_last/fp16:1,2:update \
  8:24:v_last/fp16:1,2:update 16:32,48:v_last/fp16:1,2:update
#  b. the two branch tests that had failed with CUDA out-of-memory only (4 workers beside each
#     other), alone:
cd /tmp/sr && GDNGEN_CACHE_DIR=/tmp/gc-sr python -m pytest -q -m gpu -p no:cacheprovider \
  "tests/gpu/test_call_gpu.py::test_no_recompile_for_new_batch_sizes" \
  "tests/gpu/test_engine_forms_gpu.py::test_vllm_spec_decode_batches_and_layouts[300]"
#  c. wip-core-stream's compare.py again: run.sh's step 4 had imported main's generated package
#     (setup.sh puts the repo root on PYTHONPATH, ahead of a script's own tree):
cd /tmp/cs && PYTHONPATH=/tmp/cs:$PYTHONPATH GDNGEN_CACHE_DIR=/tmp/gc-cs \
  python docs/perf/raw/h100-core-stream/compare.py /tmp/res/core-stream.jsonl
#
# H200 (GPU-af1bf078), a fresh machine, with the same bundles:
#  d. the K-last bf16 head-dims-128 set of wip-staged-raw's spec tuned again, 12 at a time
#     (run.sh's step 1 with the longest jobs split by HV):
mkdir /tmp/sr && tar -xzf .devbundle/tree-sr.tar.gz -C /tmp/sr && cd /tmp/sr && \
  GDNGEN_CACHE_DIR=/tmp/gc-sr bash docs/perf/raw/h100-tune/tune.sh 12 1000 \
  k_last/bf16:8:4:128 k_last/bf16:8:6:128 k_last/bf16:4:4,6:128 k_last/bf16:4:8,12:128 \
  k_last/bf16:2:4,6,8:128 k_last/bf16:2:12,16:128 k_last/bf16:8:64:128 k_last/bf16:8:48:128 \
  k_last/bf16:8:32:128 k_last/bf16:8:24:128 k_last/bf16:8:16:128 k_last/bf16:8:12:128 \
  k_last/bf16:8:8:128 k_last/bf16:4:32,48,64:128 k_last/bf16:4:16,24:128 \
  k_last/bf16:2:24,32,48,64:128 k_last/bf16:1::128
#  e. the TP grid's V-last bf16 cells (main's tree), then fp16 (K-last T 1/2/4/8 at H = 2 and
#     T 4/8 elsewhere, V-last T 1/2), with the time left:
export GDNGEN_CACHE_DIR=/tmp/gc-main
MARGIN=0.01 bash docs/perf/raw/tp-bench-t/bench_grid.sh /tmp/gridh200 230 8 \
  2:4,6,8:v_last/bf16:1,2:update 4:12,16:v_last/bf16:1,2:update 8:24:v_last/bf16:1,2:update \
  16:32,48:v_last/bf16:1,2:update 2:4,6,8:v_last/bf16:4,8:update 4:12,16:v_last/bf16:4,8:update \
  8:24:v_last/bf16:4,8:update 16:32,48:v_last/bf16:4,8:update
MARGIN=0.01 bash docs/perf/raw/tp-bench-t/bench_grid.sh /tmp/grid2h200 200 8 \
  4:12,16:k_last/fp16:4,8:update 8:24:k_last/fp16:4,8:update 16:32,48:k_last/fp16:4,8:update \
  2:4,6,8:v_last/fp16:1,2:update 4:12,16:v_last/fp16:1,2:update 8:24:v_last/fp16:1,2:update \
  16:32,48:v_last/fp16:1,2:update
MARGIN=0.01 bash docs/perf/raw/tp-bench-t/bench_grid.sh /tmp/grid3h200 140 8 \
  2:4,6,8:k_last/fp16:4,8:update 2:4,6,8:k_last/fp16:1,2:update
