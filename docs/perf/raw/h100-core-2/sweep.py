"""The fused core (conv1d prologue + gated RMSNorm epilogue) on each norm-capable K-last
kernel, in vLLM's form (gdngen.bench.core.core_problem), side by side per cell with the
dispatched recurrence alone. One JSON line a cell. Run from the repository root:
python docs/perf/raw/h100-core-tune/sweep.py DTYPE TOKENS BATCHES HEADS, e.g. bf16 4,8 1,16 32"""

import importlib
import json
import sys

import generated.h200 as h200
from gdngen.bench.chain_steps import EPS
from gdngen.bench.core import core_inputs, core_problem
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import TORCH_DTYPES

CANDIDATES = {
    "bf16": [
        "kl_bf16_tv16_ilp2_vec8_tpg8_sm90",
        "kl_bf16_tv16_ilp2_vec8_tpg16_sm90",
        "kl_bf16_tv16_ilp4_vec8_tpg16_sm90",
        "kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90",
        "kl_bf16_tv32_ilp2_vec8_tpg32_sm90",
        "kl_bf16_tv32_ilp4_vec8_tpg16_sm90",
        "kl_bf16_tv64_ilp8_vec8_tpg16_sm90",
        "kl_bf16_tv128_ilp8_vec8_tpg16_sm90",
    ],
    "fp32": [
        "kl_fp32_tv16_ilp4_vec4_tpg32_sm90",
        "kl_fp32_tv16_ilp4_vec4_tpg32_pre_sm90",
        "kl_fp32_tv32_ilp8_vec4_tpg32_sm90",
        "kl_fp32_tv128_ilp4_vec4_tpg32_sm90",
    ],
}
dtype = sys.argv[1]
TOKENS = [int(t) for t in sys.argv[2].split(",")]
BATCHES = [int(b) for b in sys.argv[3].split(",")]
HEADS = [int(h) for h in sys.argv[4].split(",")]

for HV in HEADS:
    for T in TOKENS:
        for B in BATCHES:
            problem = core_problem(B, T, HV, dtype)
            pool = B * T * HV * 128 * 128 * TORCH_DTYPES[dtype].itemsize
            sets = [core_inputs(problem, i, True) for i in range(rotating_sets(2 * pool))]

            def core_kwargs(s):
                return dict(s["args"], conv_state=s["conv_state"], conv_weight=s["conv_weight"],
                            conv_bias=s["conv_bias"], z=s["z"], norm_weight=s["norm_weight"],
                            norm_eps=EPS, output=s["output"])  # fmt: skip

            runs = {}
            for name in CANDIDATES[dtype]:
                module = importlib.import_module(f"generated.h200.kernels.{name}")
                if module.HEAD_K_DIM != 128 or 128 // module.TILE_V > 8:
                    continue  # not this geometry's, or too many CTAs a head for the epilogue
                kernel = h200.variant(name)
                runs["fused " + name] = [lambda s=s, c=kernel: c(**core_kwargs(s)) for s in sets]
            runs["fused (dispatch)"] = [lambda s=s: h200.gdn_decode(**core_kwargs(s)) for s in sets]
            runs["recurrence alone"] = [
                lambda s=s: h200.gdn_decode(**s["args"], output=s["output"]) for s in sets
            ]
            dispatched = h200.gdn_decode.prepare(**core_kwargs(sets[0]))
            times = time_side_by_side(runs)
            line = dict(dtype=dtype, B=B, T=T, HV=HV, dispatched=dispatched,
                        us={k: round(v, 2) for k, v in times.items()})  # fmt: skip
            print(json.dumps(line), flush=True)
