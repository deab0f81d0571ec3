import sys, json, torch
import generated.h200 as h200
from gdngen.bench.core import fla_gated_rmsnorm, EPS
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import Problem
fla = fla_gated_rmsnorm()
cands = {
 "bf16": ["kl_bf16_tv16_ilp2_vec8_tpg16_sm90","kl_bf16_tv16_ilp4_vec8_tpg16_sm90","kl_bf16_tv32_ilp4_vec8_tpg16_sm90","kl_bf16_tv64_ilp8_vec8_tpg16_sm90","kl_bf16_tv128_ilp8_vec8_tpg16_sm90"],
 "fp32": ["kl_fp32_tv16_ilp4_vec4_tpg32_sm90","kl_fp32_tv32_ilp8_vec4_tpg32_sm90","kl_fp32_tv128_ilp8_vec4_tpg32_sm90"],
}
for dt, names in cands.items():
  for B in (1, 16, 64, 512):
    HV=64
    p = Problem(batch=B, HV=HV, state_dtype=dt, pool_size=B)
    count = rotating_sets(B*HV*128*128*(2 if dt=="bf16" else 4)*2)
    sets=[]
    for i in range(count):
        a = p.with_(seed=i).make("cuda")
        z = torch.randn(B,1,HV,128,device="cuda").bfloat16(); w=torch.ones(128,device="cuda").bfloat16()
        o = torch.empty(B,1,HV,128,device="cuda",dtype=torch.bfloat16); n=torch.empty_like(o)
        sets.append((a,z,w,o,n))
    runs={}
    for name in names:
        c = h200.variant(name)
        runs["fused "+name]=[lambda s=s,c=c: c(**s[0], output=s[4], z=s[1], norm_weight=s[2]) for s in sets]
    runs["recurrence (dispatch)"]=[lambda s=s: h200.gdn_decode(**s[0], output=s[3]) for s in sets]
    if fla: runs["chain FLA"]=[lambda s=s: (h200.gdn_decode(**s[0], output=s[3]), fla(s[3],s[1],s[2],s[4])) for s in sets]
    for name in names:
        c=h200.variant(name); runs["plain "+name]=[lambda s=s,c=c: c(**s[0], output=s[3]) for s in sets]
    t = time_side_by_side(runs)
    print(json.dumps(dict(dt=dt,B=B,HV=HV,us={k:round(v,2) for k,v in t.items()})), flush=True)
