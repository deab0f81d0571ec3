"""Experiment: does a kernel's speed depend on where its state pool lies (byte offset of the base)?

For K-last bf16 T=4 update cells where the tune and the bench disagreed, time the contenders side by
side with each input set's pool copied to a buffer at several byte offsets from a fresh allocation.
Run: python offsets-experiment.py 32x512,64x256 0,16,512,1024,4096,16384,65536,1048576 2
"""
import json, sys, time, torch
from gdngen.problem import Problem
from gdngen.bench.impls import Gdngen
from gdngen.bench.timing import rotating_sets, time_side_by_side

P = "kl_bf16_tv128_ilp4_vec8_tpg16_passes4"
names = [f"{P}_staged_sm90", f"{P}_unroll_staged_sm90", f"{P}_occ5_staged_sm90",
         f"{P}_pf_unroll_staged_sm90", "kl_bf16_tv64_ilp8_vec8_tpg16_staged_sm90"]
short = {n: n.replace(P, "").replace("kl_bf16_", "").replace("_sm90", "") for n in names}
cells = [tuple(int(x) for x in c.split("x")) for c in sys.argv[1].split(",")]  # HVxB
offsets = [int(x) for x in sys.argv[2].split(",")]
reps = int(sys.argv[3])
impls = {n: Gdngen("h200", n) for n in names}
def log(**kw):
    kw.update(t=round(time.time(), 1)); print(json.dumps(kw), flush=True)
for HV, B in cells:
    problem = Problem(batch=B, tokens=4, H=16, HV=HV, K=128, V=128, layout="k_last",
                      state_dtype="bf16", pool_size=B)
    sets = rotating_sets(problem.moved_bytes())
    base = [problem.with_(seed=s).make("cuda") for s in range(sets)]
    n = base[0]["initial_state"].numel()
    bufs = [torch.empty(n + (max(offsets) // 2) + 64, dtype=torch.bfloat16, device="cuda") for _ in base]
    log(HV=HV, B=B, sets=sets, buf_ptr_mod_2M=[b.data_ptr() % (2 << 20) for b in bufs],
        default_ptr_mod_2M=[x["initial_state"].data_ptr() % (2 << 20) for x in base])
    for rep in range(reps):
        for off in offsets:
            inputs = []
            for x, buf in zip(base, bufs):
                view = buf[off // 2 : off // 2 + n].view(x["initial_state"].shape)
                view.copy_(x["initial_state"])
                inputs.append(dict(x, initial_state=view))
            runs = {nm: [impls[nm].bind(problem, x).run for x in inputs] for nm in names}
            t = time_side_by_side(runs, replays=20)
            log(HV=HV, B=B, rep=rep, off=off, us={short[k]: round(v, 1) for k, v in t.items()})
    del base, bufs
    torch.cuda.empty_cache()
