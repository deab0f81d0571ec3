# Scratch (not committed): where the T = 8 prologue's time goes.
import json, torch
import generated.h200 as h200
from gdngen.bench.core import core_problem, core_inputs, EPS
from gdngen.problem import PackedProblem
from gdngen.measure.timing import time_side_by_side

def entries(B, T, HV, slots, variants):
    prob = core_problem(B, T, HV, "bf16").with_(slots=slots)
    sets = [core_inputs(prob, i, True) for i in range(2)]
    runs = {}
    for name in variants:
        call = h200.gdn_decode if name == "dispatch" else h200.variant(name)
        for label, conv, norm in (("conv+norm", True, True), ("norm", False, True), ("conv", True, False), ("plain", False, False)):
            def run(s, call=call, conv=conv, norm=norm):
                kw = dict(s["args"])
                if conv:
                    kw.update(conv_state=s["conv_state"], conv_weight=s["conv_weight"], conv_bias=s["conv_bias"])
                if norm:
                    kw.update(z=s["z"], norm_weight=s["norm_weight"], norm_eps=EPS)
                call(**kw, output=s["output"])
            runs[f"{name} {label}"] = [lambda s=s, run=run: run(s) for s in sets]
    us = time_side_by_side(runs)
    print(json.dumps(dict(B=B, T=T, HV=HV, slots=slots, us={k: round(v, 1) for k, v in us.items()})), flush=True)

for B in (16, 64):
    entries(B, 8, 32, "per_token", ["dispatch", "kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90", "kl_bf16_tv128_ilp8_vec8_tpg16_sm90"])
    entries(B, 8, 32, "row", ["dispatch"])
    entries(B, 4, 32, "per_token", ["dispatch"])
