"""Where an eager call's host time goes (B=1, T=1, K-last bf16, HV=64): the whole call, building
the signature key alone, and the TVM-FFI kernel call alone. One JSON line."""

import json

import torch
from coldstart import per_call_us  # (this folder: the same timing loop)

import generated.h200 as h200
from gdngen.problem import Problem
from gdngen.runtime import launcher


args = Problem(batch=1, tokens=1, HV=64, pool_size=1).make("cuda")
out = torch.empty(1, 1, 64, 128, dtype=torch.bfloat16, device="cuda")
call = h200.gdn_decode
call(**args, output=out)
(plan,) = call._plans.values()
q, k, v, a, b = args["q"], args["k"], args["v"], args["a"], args["b"]
A_log, dt_bias, pool, slots = args["A_log"], args["dt_bias"], args["initial_state"], args["initial_state_indices"]


def key_only():
    return launcher.call_key(q, k, v, None, A_log, a, dt_bias, b, None, out, True, pool, slots,
                             None, None, False, "k_last")


def kernel_only():
    plan.kernel(q, k, v, a, b, A_log, dt_bias, pool, slots, None, out, None, plan.scale)


x = torch.zeros(1024, device="cuda")
print(json.dumps({
    "whole call (output given)": per_call_us(lambda: call(**args, output=out)),
    "signature key only": per_call_us(key_only),
    "TVM-FFI kernel call only": per_call_us(kernel_only),
    "torch.empty output": per_call_us(lambda: torch.empty(1, 1, 64, 128, dtype=torch.bfloat16, device="cuda")),
    "torch x.add_(1.0)": per_call_us(lambda: x.add_(1.0)),
}))
