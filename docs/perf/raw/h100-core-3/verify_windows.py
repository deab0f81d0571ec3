"""SGLang's target verify with the whole core fused: the conv1d prologue writing its conv window
after every draft token (intermediate_conv_windows, SGLang's deduplicated view) beside the
recurrent state cache, and the gated RMSNorm epilogue. Side by side per cell (gdngen.measure.
timing) with the same verify call on post-conv rows (norm fused, no conv), FLA's conv kernel
followed by that call, and the recurrence alone. One JSON line a cell; every cell's fused output
is checked against the FLA-conv chain's first. Run from the repository root:

    python docs/perf/raw/h100-core-3/verify_windows.py TOKENS BATCHES HEADS   # e.g. 2,4,8 1,16 32
"""

import json
import sys

import torch

import generated.h200 as h200
from gdngen.bench.chain_steps import EPS, fla_conv1d
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import PackedProblem

WIDTH = 4
TOKENS = [int(t) for t in sys.argv[1].split(",")]
BATCHES = [int(b) for b in sys.argv[2].split(",")]
HEADS = [int(h) for h in sys.argv[3].split(",")]
conv_step = fla_conv1d()


def inputs(B, T, HV, seed):
    """One input set in SGLang's verify form: [N] slots (pad -1), pool-row caches, packed
    draft tokens of pre-conv rows, a channels-first conv pool of W - 1 columns."""
    problem = PackedProblem(
        sequences=B, tokens=T, HV=HV, slots="row", null_slot=-1, cache="rows",
        cache_rows=B + 1, disable_state_update=True, mixed_qkv=True, flat=True, seed=seed,
    )  # fmt: skip
    args = problem.make("cuda")
    args["intermediate_states_buffer"].zero_()
    gen = torch.Generator(device="cuda").manual_seed(1000 + seed)
    D = 2 * problem.H * problem.K + HV * problem.V
    total = args["mixed_qkv"].shape[0]

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * std).bfloat16()

    slots = args["initial_state"].shape[0]
    shared = torch.zeros(B + 1, D, T + WIDTH - 2, dtype=torch.bfloat16, device="cuda")
    windows = shared.as_strided(
        (B + 1, T, D, WIDTH - 1), (shared.stride(0), 1, shared.stride(1), 1)
    )
    reads = args["initial_state_indices"].long()
    conv_state = randn(slots, D, WIDTH - 1)
    fla_cache = torch.zeros(B, D, WIDTH, dtype=torch.bfloat16, device="cuda")
    fla_cache[:, :, 1:] = conv_state[reads]
    return dict(
        args=args, conv_state=conv_state, conv_weight=randn(D, WIDTH, std=0.5),
        conv_bias=randn(D, std=0.2), windows=windows, fla_cache=fla_cache,
        z=randn(total, HV, problem.V),
        norm_weight=(1 + 0.1 * torch.randn(problem.V, generator=gen, device="cuda")).bfloat16(),
        output=torch.empty(total, HV, problem.V, dtype=torch.bfloat16, device="cuda"),
    )  # fmt: skip


for HV in HEADS:
    for T in TOKENS:
        for B in BATCHES:
            cell_bytes = (T + 1) * B * HV * 128 * 128 * 2
            sets = [inputs(B, T, HV, i) for i in range(rotating_sets(cell_bytes))]

            def norm(s):
                return dict(
                    z=s["z"], norm_weight=s["norm_weight"], norm_eps=EPS, output=s["output"]
                )

            def fused(s):
                return h200.gdn_decode(
                    **s["args"], **norm(s), conv_state=s["conv_state"],
                    conv_weight=s["conv_weight"], conv_bias=s["conv_bias"],
                    intermediate_conv_windows=s["windows"],
                )  # fmt: skip

            def convolved(s):
                x = s["args"]["mixed_qkv"]
                y = conv_step(x.view(B, T, -1), s["fla_cache"], s["conv_weight"], s["conv_bias"])
                return y.view(x.shape)

            def conv_then_norm_fused(s):
                return h200.gdn_decode(**dict(s["args"], mixed_qkv=convolved(s)), **norm(s))

            first = sets[0]
            fused_out = fused(first)[0].float()
            chain_out = conv_then_norm_fused(first)[0].float()
            error = ((fused_out - chain_out).norm() / chain_out.norm()).item()
            runs = {
                "fused core (conv windows)": [lambda s=s: fused(s) for s in sets],
                "FLA conv, norm-fused verify": [lambda s=s: conv_then_norm_fused(s) for s in sets],
                "norm-fused verify, no conv": [
                    lambda s=s: h200.gdn_decode(**s["args"], **norm(s)) for s in sets
                ],
                "recurrence alone": [
                    lambda s=s: h200.gdn_decode(**s["args"], output=s["output"]) for s in sets
                ],
            }
            variant = h200.gdn_decode.prepare(
                **first["args"], **norm(first), conv_state=first["conv_state"],
                conv_weight=first["conv_weight"], conv_bias=first["conv_bias"],
                intermediate_conv_windows=first["windows"],
            )  # fmt: skip
            times = time_side_by_side(runs)
            line = dict(B=B, T=T, HV=HV, variant=variant, rel_error=round(error, 5),
                        us={k: round(v, 2) for k, v in times.items()})  # fmt: skip
            print(json.dumps(line), flush=True)
