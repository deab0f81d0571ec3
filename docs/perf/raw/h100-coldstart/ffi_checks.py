"""Which bad arguments the TVM-FFI function of a compiled kernel rejects by itself (before launch)."""
import json, torch
import generated.h200 as h200
from gdngen.problem import Problem
args = Problem(batch=4, tokens=1, HV=64, pool_size=8).make("cuda")
out = torch.empty(4, 1, 64, 128, dtype=torch.bfloat16, device="cuda")
h200.gdn_decode(**args, output=out); torch.cuda.synchronize()
(plan,) = h200.gdn_decode._plans.values()
K = plan.kernel
base = dict(q=args["q"], k=args["k"], v=args["v"], a=args["a"], b=args["b"], A_log=args["A_log"], dt_bias=args["dt_bias"],
            pool=args["initial_state"], rs=args["initial_state_indices"], ws=None, out=out, cache=None)
def call(**ch):
    d = {**base, **ch}
    K(d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], d["pool"], d["rs"], d["ws"], d["out"], d["cache"], plan.scale)
res = {}
def trial(name, **ch):
    try:
        call(**ch); torch.cuda.synchronize(); res[name] = "no error"
    except Exception as e:
        res[name] = f"{type(e).__name__}: {str(e)[:160]}"
big = torch.zeros(4*1*16*128 + 8, dtype=torch.bfloat16, device="cuda")
trial("q_batch_mismatch", q=args["q"][:3])
trial("q_dtype", q=args["q"].half())
trial("q_inner_stride", q=torch.zeros(4,1,16,256,dtype=torch.bfloat16,device="cuda")[..., ::2])
trial("q_outer_stride_not_div8", q=torch.zeros(4,1,16*128+4,dtype=torch.bfloat16,device="cuda")[:, :, :2048].view(4,1,16,128) if False else torch.as_strided(torch.zeros(4*2052+8,dtype=torch.bfloat16,device="cuda"), (4,1,16,128), (2052,2052,128,1)))
trial("pool_overlap_stride", pool=torch.as_strided(args["initial_state"], (8,64,128,128), (1024,128*128,128,1)))
trial("slots_int64", rs=args["initial_state_indices"].long())
trial("cpu_tensor_a", a=args["a"].cpu())
trial("A_log_noncontig", A_log=torch.zeros(128, device="cuda")[::2])
trial("out_wrong_shape", out=torch.empty(4,1,64,64,dtype=torch.bfloat16,device="cuda"))
trial("q_misaligned", q=big[1:1+4*16*128].view(4,1,16,128))
print(json.dumps(res, indent=1))
