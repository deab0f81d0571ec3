"""The conv1d prologue's cost per cell: the fused core (conv + gated RMSNorm) against the same
call on post-conv rows (the norm alone) and the recurrence alone, side by side (gdngen.measure.
timing), in the core bench's vLLM forms (gdngen.bench.core.core_problem). Run it once per build
(e.g. before and after a change, each from its own tree) and compare the ratios. One JSON line
a cell. From the repository root:

    python docs/perf/raw/h100-core-3/prologue_probe.py DTYPE TOKENS BATCHES HEADS
    # e.g. bf16 1,4 1,64,512 32,64
"""

import json
import sys

import generated.h200 as h200
from gdngen.bench.chain_steps import EPS
from gdngen.bench.core import core_inputs, core_problem
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import TORCH_DTYPES

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

            def norm(s):
                return dict(
                    z=s["z"], norm_weight=s["norm_weight"], norm_eps=EPS, output=s["output"]
                )

            def conv(s):
                return dict(
                    conv_state=s["conv_state"], conv_weight=s["conv_weight"],
                    conv_bias=s["conv_bias"],
                )  # fmt: skip

            first = sets[0]
            variant = h200.gdn_decode.prepare(**first["args"], **conv(first), **norm(first))
            call = h200.variant(variant)  # the same kernel for every entry but the last
            runs = {
                "conv + norm": [lambda s=s: call(**s["args"], **conv(s), **norm(s)) for s in sets],
                "norm only": [lambda s=s: call(**s["args"], **norm(s)) for s in sets],
                "recurrence alone": [
                    lambda s=s: h200.gdn_decode(**s["args"], output=s["output"]) for s in sets
                ],
            }
            times = time_side_by_side(runs)
            line = dict(dtype=dtype, B=B, T=T, HV=HV, variant=variant,
                        us={k: round(v, 2) for k, v in times.items()})  # fmt: skip
            print(json.dumps(line), flush=True)
