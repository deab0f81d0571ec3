"""The fused core (conv1d prologue + gated RMSNorm epilogue) on every kernel of specs/h200.yaml
that has the epilogue for K = V = 128, in vLLM's forms (gdngen.bench.core.core_problem), side by
side per cell with the fused call as dispatched and the unfused recurrence as dispatched. Unlike
raw/h100-core-2/sweep.py (a fixed list of 2026-11-24's kernels) it takes the candidates from the
spec, so the evict-first (ldcs/stcs) and later kernels are in. One JSON line a cell; a kernel
whose fused call fails to build or run is recorded with its error and skipped.

usage (repository root, on the GPU): python core_sweep.py OUT.jsonl DTYPE TOKENS BATCHES HEADS [norm]
  e.g. core_sweep.py sweep.jsonl bf16 1 64,256,512 32,64; with `norm`, the calls take post-conv
  rows and only the norm is fused (no conv1d prologue).
"""

import json
import sys

import generated.h200 as h200
from gdngen.bench.chain_steps import EPS
from gdngen.bench.core import core_inputs, core_problem
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import TORCH_DTYPES
from gdngen.spec import load_spec

out, dtype = sys.argv[1], sys.argv[2]
TOKENS, BATCHES, HEADS = ([int(x) for x in arg.split(",")] for arg in sys.argv[3:6])
conv = sys.argv[6:] != ["norm"]
spec = load_spec("specs/h200.yaml")
candidates = [
    name
    for name, v in spec.variants_by_name.items()
    if (v.layout, v.state_dtype) == ("k_last", dtype)
    and v.serves_head_dims(128, 128)
    and v.serves_gated_norm(128)
]
print(f"{len(candidates)} candidates: {candidates}", flush=True)

with open(out, "a") as sink:
    for HV in HEADS:
        for T in TOKENS:
            for B in BATCHES:
                problem = core_problem(B, T, HV, dtype)
                pool = B * T * HV * 128 * 128 * TORCH_DTYPES[dtype].itemsize
                sets = [core_inputs(problem, i, conv) for i in range(rotating_sets(2 * pool))]

                def core_kwargs(s):
                    steps = dict(z=s["z"], norm_weight=s["norm_weight"], norm_eps=EPS)
                    if conv:
                        steps.update(conv_state=s["conv_state"], conv_weight=s["conv_weight"],
                                     conv_bias=s["conv_bias"])  # fmt: skip
                    return dict(s["args"], **steps, output=s["output"])

                runs, errors = {}, {}
                for name in candidates:
                    kernel = h200.variant(name)
                    try:
                        kernel(**core_kwargs(sets[0]))  # build (or load) and run once
                    except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                        errors[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                        continue
                    runs[name] = [lambda s=s, c=kernel: c(**core_kwargs(s)) for s in sets]
                runs["fused (dispatch)"] = [
                    lambda s=s: h200.gdn_decode(**core_kwargs(s)) for s in sets
                ]
                runs["recurrence (dispatch)"] = [
                    lambda s=s: h200.gdn_decode(**s["args"], output=s["output"]) for s in sets
                ]
                times = time_side_by_side(runs)
                line = dict(
                    dtype=dtype, B=B, T=T, HV=HV, fused="conv+norm" if conv else "norm",
                    fused_dispatch=h200.gdn_decode.prepare(**core_kwargs(sets[0])),
                    recurrence_dispatch=h200.gdn_decode.prepare(**sets[0]["args"],
                                                                output=sets[0]["output"]),
                    us={k: round(v, 2) for k, v in times.items()}, errors=errors,
                )  # fmt: skip
                print(json.dumps(line), flush=True)
                sink.write(json.dumps(line) + "\n")
                sink.flush()
