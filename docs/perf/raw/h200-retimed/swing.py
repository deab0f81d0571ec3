"""Experiment: does a contender's time swing with the allocation, the process, or GPU heat?"""
import json, sys, time, torch
from gdngen.problem import Problem
from gdngen.bench.impls import Gdngen
from gdngen.bench.timing import rotating_sets, time_side_by_side

P = "kl_bf16_tv128_ilp4_vec8_tpg16_passes4"
names = [f"{P}_staged_sm90", f"{P}_unroll_staged_sm90", f"{P}_occ5_staged_sm90",
         f"{P}_ldcs_stcs_staged_sm90", f"{P}_pf_unroll_staged_sm90"]
tag = sys.argv[1]
batches = [int(b) for b in sys.argv[2].split(",")]
allocs_n = int(sys.argv[3])
heat_s = float(sys.argv[4])
impls = {n: Gdngen("h200", n) for n in names}
out = []
def log(**kw):
    kw.update(tag=tag, t=round(time.time(), 1))
    print(json.dumps(kw), flush=True)
for B in batches:
    problem = Problem(batch=B, tokens=4, H=16, HV=64, K=128, V=128, layout="k_last",
                      state_dtype="bf16", pool_size=B)
    sets = rotating_sets(problem.moved_bytes())
    keep = []
    for a in range(allocs_n):
        inputs = [problem.with_(seed=(1000 * (a - 1) if a > 1 else 0) + s).make("cuda") for s in range(sets)]
        keep.append(inputs)
        runs = {n: [impls[n].bind(problem, x).run for x in inputs] for n in names}
        ptrs = [hex(x["initial_state"].data_ptr()) for x in inputs]
        for rep in range(2):
            t = time_side_by_side(runs, replays=15)
            log(B=B, alloc=a, rep=rep, ptrs=ptrs, us={k[len(P):]: round(v, 2) for k, v in t.items()})
    if heat_s > 0:
        inputs = keep[0]
        runs = {n: [impls[n].bind(problem, x).run for x in inputs] for n in names}
        end = time.time() + heat_s
        r = runs[names[2]]
        while time.time() < end:
            for _ in range(50):
                for f in r: f()
            torch.cuda.synchronize()
        t = time_side_by_side(runs, replays=15)
        log(B=B, alloc=0, rep="after_heat", us={k[len(P):]: round(v, 2) for k, v in t.items()})
    del keep
    torch.cuda.empty_cache()
