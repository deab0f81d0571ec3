"""Where the conv1d prologue's time goes at T = 1: one input set of the core bench's cell
(vLLM's decode form, K-last bf16, HV 32), three calls that share one kernel variant, each twice:

- conv + norm: the fused core (the prologue and the gated RMSNorm epilogue);
- norm only: the same rows as post-conv inputs, the epilogue alone;
- conv only: the prologue alone, written through the same variant.

Run under Nsight Compute, e.g. (from the repository root):

    ncu --clock-control none --kernel-name regex:kl_ --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --csv --page details \
        python docs/perf/raw/h100-core-3/t1_profile.py 512
"""

import sys

import torch

import generated.h200 as h200
from gdngen.bench.chain_steps import EPS
from gdngen.bench.core import core_inputs, core_problem

B = int(sys.argv[1]) if len(sys.argv) > 1 else 512
VARIANT = "kl_bf16_tv128_ilp8_vec8_tpg16_sm90"
s = core_inputs(core_problem(B, 1, 32, "bf16"), 0, True)
call = h200.variant(VARIANT)
conv = dict(conv_state=s["conv_state"], conv_weight=s["conv_weight"], conv_bias=s["conv_bias"])
norm = dict(z=s["z"], norm_weight=s["norm_weight"], norm_eps=EPS)
forms = {"conv + norm": {**conv, **norm}, "norm only": norm, "conv only": conv}
for name, extra in forms.items():
    for _ in range(2):
        call(**s["args"], **extra, output=s["output"])
    torch.cuda.synchronize()
    print(name, "done", flush=True)
