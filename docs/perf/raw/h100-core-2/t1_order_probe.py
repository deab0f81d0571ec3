# Scratch probe: the conv prologue's cost at T = 1 under the reader count's memory order
# (GDNGEN_PROBE: acq_rel, release, relaxed, none = no q/k conv write at all), side by side
# with the norm-fused call on post-conv inputs. One process per mode (the mode is read at trace).
import json, os, sys, torch
import generated.h200 as h200
from gdngen.measure.timing import rotating_sets, time_side_by_side
from tests.gpu.test_conv_gpu import make_case
H, K, V = 16, 128, 128
mode = os.environ.get("GDNGEN_PROBE", "acq_rel")
for HV, T in ((32, 1), (64, 1), (32, 4)):
    for B in (1, 16, 64, 512):
        n = rotating_sets(B * HV * K * V * 2 * 2)
        sets = []
        for i in range(n):
            c = make_case(B=B, T=T, HV=HV, slots=B, seed=i)
            z = torch.randn(B, T, HV, V, device="cuda").bfloat16()
            w = torch.ones(V, device="cuda").bfloat16()
            out = torch.empty(B, T, HV, V, device="cuda").bfloat16()
            sets.append((c, z, w, out))
        call = h200.gdn_decode
        def plain(s):
            c, z, w, out = s
            d = {k: v for k, v in c.items() if not k.startswith("conv")}
            call(**d, z=z, norm_weight=w, output=out)
        def fused(s):
            c, z, w, out = s
            call(**c, z=z, norm_weight=w, output=out)
        for s in sets[:1]:
            plain(s); fused(s)
        us = time_side_by_side({"norm fused": [lambda s=s: plain(s) for s in sets],
                                "conv+norm fused": [lambda s=s: fused(s) for s in sets]})
        v = call.prepare(**sets[0][0], z=sets[0][1], norm_weight=sets[0][2], output=sets[0][3])
        print(json.dumps(dict(mode=mode, HV=HV, T=T, B=B, variant=v, us=us,
                              ratio=us["conv+norm fused"] / us["norm fused"])), flush=True)
