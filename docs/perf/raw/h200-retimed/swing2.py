"""Experiment: does timing 16 candidates side by side (as the tune does) rank them differently
from timing the 5 contenders (as the bench does)?"""
import json, sys, time, torch
from gdngen.problem import Problem
from gdngen.bench.impls import Gdngen
from gdngen.bench.timing import rotating_sets, time_side_by_side
from gdngen.spec.load import load_spec

spec = load_spec("specs/h200.yaml")
allnames = sorted(n for n, v in spec.variants_by_name.items() if (v.layout, v.state_dtype) == ("k_last", "bf16"))
P = "kl_bf16_tv128_ilp4_vec8_tpg16_passes4"
top = [f"{P}_staged_sm90", f"{P}_unroll_staged_sm90", f"{P}_occ5_staged_sm90",
       f"{P}_ldcs_stcs_staged_sm90", f"{P}_pf_unroll_staged_sm90"]
tag = sys.argv[1]
impls = {n: Gdngen("h200", n) for n in allnames}
def log(**kw):
    kw.update(tag=tag, t=round(time.time(), 1))
    print(json.dumps(kw), flush=True)
for B in [int(b) for b in sys.argv[2].split(",")]:
    problem = Problem(batch=B, tokens=4, H=16, HV=64, K=128, V=128, layout="k_last",
                      state_dtype="bf16", pool_size=B)
    sets = rotating_sets(problem.moved_bytes())
    inputs = [problem.with_(seed=s).make("cuda") for s in range(sets)]
    runs = {n: [impls[n].bind(problem, x).run for x in inputs] for n in allnames}
    for rep, chosen in enumerate([allnames, top, allnames, top[::-1], allnames, top]):
        t0 = time.time()
        t = time_side_by_side({n: runs[n] for n in chosen}, replays=15)
        log(B=B, rep=rep, n=len(chosen), secs=round(time.time() - t0, 2),
            us={k[len(P):]: round(v, 2) for k, v in t.items() if k in top})
    del inputs, runs
    torch.cuda.empty_cache()
