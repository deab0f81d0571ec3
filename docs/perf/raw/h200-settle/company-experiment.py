"""Experiment: does a kernel's time depend on which kernels are timed beside it, and does naming a
shared-memory carveout at launch change that? K-last bf16 T=4 update, HV=32 B=512 and HV=64 B=256.
Carveout copies of two kernels are written next to the generated ones (run on a scratch tree)."""
import json, time
from pathlib import Path
import torch
import generated.h200 as target
from gdngen.problem import Problem
from gdngen.bench.impls import Gdngen
from gdngen.bench.timing import rotating_sets, time_side_by_side

KDIR = Path(target.__file__).parent / "kernels"
P = "kl_bf16_tv128_ilp4_vec8_tpg16_passes4"
OCC5, UNROLL = f"{P}_occ5_staged_sm90", f"{P}_unroll_staged_sm90"

def carveout_copy(name, value):
    new = name.replace("_sm90", f"_cv{value}_sm90")
    src = (KDIR / f"{name}.py").read_text().replace(f'NAME = "{name}"', f'NAME = "{new}"')
    if "preferred_smem_carveout=-1" in src:
        src = src.replace("preferred_smem_carveout=-1", f"preferred_smem_carveout={value}")
    else:
        src = src.replace("block=(THREADS, 1, 1),", f"block=(THREADS, 1, 1), preferred_smem_carveout={value},")
    (KDIR / f"{new}.py").write_text(src)
    return new

extra = [carveout_copy(OCC5, 100), carveout_copy(UNROLL, 100), carveout_copy(OCC5, 25)]
target._target.variants = target._target.variants + tuple(extra)
candidates = sorted(n for n in target.VARIANTS if n.startswith("kl_bf16_"))
short = lambda n: n.replace(P, "P").replace("kl_bf16_", "").replace("_sm90", "")
def log(**kw):
    kw.update(t=round(time.time(), 1)); print(json.dumps(kw), flush=True)

for HV, B in [(32, 512), (64, 256)]:
    problem = Problem(batch=B, tokens=4, H=16, HV=HV, K=128, V=128, layout="k_last",
                      state_dtype="bf16", pool_size=B)
    sets = rotating_sets(problem.moved_bytes())
    inputs = [problem.with_(seed=s).make("cuda") for s in range(sets)]
    runs = {n: [Gdngen("h200", n).bind(problem, x).run for x in inputs] for n in candidates + extra}
    def tm(names, tag):
        t = time_side_by_side({n: runs[n] for n in names}, replays=20)
        log(HV=HV, B=B, tag=tag, us={short(k): round(v, 1) for k, v in t.items()})
    for rep in range(2):
        tm(candidates, "tune order, forward")
        tm(list(reversed(candidates)), "tune order, reversed")
    for pred in [f"{P}_ldcs_stcs_staged_sm90", f"{P}_pf_staged_sm90", UNROLL,
                 "kl_bf16_tv64_ilp8_vec8_tpg16_sm90", "kl_bf16_tv16_ilp2_vec8_tpg16_sm90",
                 "kl_bf16_tv128_ilp8_vec8_tpg16_staged_sm90"]:
        tm([pred, OCC5], f"after {short(pred)}")
        tm([pred, OCC5.replace("_sm90", "_cv100_sm90")], f"after {short(pred)}")
    for rep in range(2):
        tm(candidates + extra, "all + carveout copies, forward")
        tm(list(reversed(candidates + extra)), "all + carveout copies, reversed")
    del inputs, runs
    torch.cuda.empty_cache()
