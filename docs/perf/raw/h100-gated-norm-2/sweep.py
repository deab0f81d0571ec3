"""Each norm-capable K-last kernel with the epilogue (fused) against itself without it (plain),
HV = 64, T = 1 (decode) and T > 1 (verify with a cache), side by side per cell; also the
dispatched recurrence. One JSON line a cell. Run from the repository root:
python docs/perf/raw/h100-gated-norm-2/sweep.py [TOKENS [BATCHES [small]]], e.g. 2,4,8 1,4 small
(default: T 1,4 and B 1,16,64,512 over CANDIDATES)"""

import json
import sys

import torch

import generated.h200 as h200
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import Problem

CANDIDATES = {
    "bf16": [
        "kl_bf16_tv32_ilp4_vec8_tpg16_sm90",
        "kl_bf16_tv64_ilp8_vec8_tpg16_sm90",
        "kl_bf16_tv128_ilp8_vec8_tpg16_sm90",
    ],
    "fp32": [
        "kl_fp32_tv16_ilp4_vec4_tpg32_sm90",
        "kl_fp32_tv32_ilp8_vec4_tpg32_sm90",
        "kl_fp32_tv128_ilp4_vec4_tpg32_sm90",
    ],
}
#: small batches at T > 1: the kernels the recurrence's dispatch takes there (more CTAs, inputs
#: preloaded), with the epilogue
SMALL_BATCH = {
    "bf16": [
        "kl_bf16_tv32_ilp4_vec8_tpg16_sm90",
        "kl_bf16_tv16_ilp4_vec8_tpg16_sm90",
        "kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90",
        "kl_bf16_tv64_ilp8_vec8_tpg16_sm90",
    ],
    "fp32": [
        "kl_fp32_tv32_ilp8_vec4_tpg32_sm90",
        "kl_fp32_tv16_ilp4_vec4_tpg32_sm90",
        "kl_fp32_tv16_ilp4_vec4_tpg32_pre_sm90",
    ],
}
TOKENS = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 4]
BATCHES = [int(b) for b in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 16, 64, 512]
if len(sys.argv) > 3 and sys.argv[3] == "small":
    CANDIDATES = SMALL_BATCH
HEADS = 64

for T in TOKENS:
    for dtype, names in CANDIDATES.items():
        for B in BATCHES:
            verify = T > 1
            problem = Problem(
                batch=B, tokens=T, HV=HEADS, state_dtype=dtype, pool_size=B,
                cache_steps=T if verify else None, disable_state_update=verify,
            )  # fmt: skip
            count = rotating_sets(B * HEADS * 128 * 128 * problem.state_bytes() * (T + 1))
            sets = []
            for i in range(count):
                args = problem.with_(seed=i).make("cuda")
                z = torch.randn(B, T, HEADS, 128, device="cuda").bfloat16()
                w = torch.ones(128, device="cuda").bfloat16()
                o = torch.empty(B, T, HEADS, 128, device="cuda", dtype=torch.bfloat16)
                sets.append((args, z, w, o, torch.empty_like(o)))
            runs = {}
            for name in names:
                kernel = h200.variant(name)
                runs["fused " + name] = [
                    lambda s=s, c=kernel: c(**s[0], output=s[4], z=s[1], norm_weight=s[2])
                    for s in sets
                ]
                runs["plain " + name] = [lambda s=s, c=kernel: c(**s[0], output=s[3]) for s in sets]
            runs["recurrence (dispatch)"] = [
                lambda s=s: h200.gdn_decode(**s[0], output=s[3]) for s in sets
            ]
            times = time_side_by_side(runs)
            line = dict(
                dtype=dtype, B=B, T=T, HV=HEADS, us={k: round(v, 2) for k, v in times.items()}
            )
            print(json.dumps(line), flush=True)
