"""Experiment: K-last fp32 T=1 at large batch, one kernel, three forms of the same call in one
process: a pool with randomly permuted slots (what the bench runs), a dense per-batch state (what
FLA runs), and (first run, lines 1-16 of pool-form-experiment.jsonl) a pool of 2B slots written
to other slots than read (out of place; that run had `separate` in (False, True) and
pool_size=2 * B, separate_write_slots=separate, two repetitions)."""
import json
from gdngen.problem import Problem
from gdngen.bench.impls import Gdngen
from gdngen.bench.run import measure_side_by_side
from gdngen.bench.timing import copy_bandwidth

bw = copy_bandwidth()
names = ["kl_fp32_tv8_ilp8_vec4_tpg32_sm90", "kl_fp32_tv8_ilp8_vec4_tpg32_ldcs_stcs_sm90"]
for HV, B in [(32, 256), (32, 512), (64, 64), (64, 256)]:
    for rep in range(1):
        for separate in ("pool", "dense"):
            p = Problem(batch=B, tokens=1, H=16, HV=HV, layout="k_last", state_dtype="fp32",
                        pool_size=B if separate == "pool" else None)
            res = measure_side_by_side([Gdngen("h200")] + [Gdngen("h200", n) for n in names], p, bw)
            print(json.dumps(dict(HV=HV, B=B, rep=rep, separate=separate,
                  us={r.impl.replace("kl_fp32_", ""): round(r.us, 2) for r in res},
                  sol={r.impl.replace("kl_fp32_", ""): round(r.sol, 3) for r in res})), flush=True)
