"""Branch-free gates against main's gates, side by side in one process (docs/perf/h200-2026-11-23-gates.md).

main:        softplus behind `if x <= 20`, beta = 1 / (1 + exp(-b)) (an IEEE division)
branchfree:  softplus through select_, beta through rcp.approx (gates_ab/h200, emitted from the
             edited _macros.j2 with `gdngen emit specs/h200.yaml --out gates_ab`)

Run on the GPU machine: python gates_ab.py OUT.json
"""
import importlib, json, sys
import generated.h200 as main_target
from gdngen.problem import PackedProblem, Problem
from gdngen.measure.timing import rotating_sets, time_side_by_side

targets = {"main": main_target, "branchfree": importlib.import_module("gates_ab.h200")}


def sets_of(make, size):
    return [make(i) for i in range(rotating_sets(size))]


def spec_form(B, T, dt):  # vLLM's spec-decode form: packed tokens, slot table, num_accepted_tokens
    base = PackedProblem(sequences=B, tokens=T, state_dtype=dt, H=16, HV=64, null_slot=0)
    return lambda i: base.with_(seed=i).make("cuda")


def pos_dense(B, T, dt):  # the positional verify form on dense [B, T] tokens
    base = PackedProblem(sequences=B, tokens=T, state_dtype=dt, H=16, HV=64, null_slot=0)

    def make(i):
        a = base.with_(seed=i, slots="row", cache="positional", disable_state_update=True).make("cuda")
        for n, d in (("q", 16), ("k", 16), ("v", 64)):
            a[n] = a[n].view(B, T, d, 128)
        for n in ("a", "b"):
            a[n] = a[n].reshape(B, T, 64)
        del a["cu_seqlens"], a["max_seqlen"]
        return a

    return make


def decode(B, layout, dt):  # plain T=1 decode on a pool
    base = Problem(batch=B, tokens=1, HV=64, layout=layout, state_dtype=dt, pool_size=B)
    return lambda i: base.with_(seed=i).make("cuda")


cells = []
for B, T, dt in [(1, 2, "bf16"), (1, 4, "bf16"), (1, 8, "bf16"), (32, 4, "bf16"), (128, 8, "bf16"),
                 (512, 4, "bf16"), (1, 4, "fp32"), (32, 8, "fp32")]:
    size = B * 64 * 128 * 128 * (2 if dt == "bf16" else 4) * (T + 1)
    cells.append((f"spec B={B} T={T} {dt}", spec_form(B, T, dt), size))
    cells.append((f"pos_dense B={B} T={T} {dt}", pos_dense(B, T, dt), size))
for B in (1, 32, 512):
    for layout in ("k_last", "v_last"):
        for dt in ("bf16", "fp32"):
            size = B * 64 * 128 * 128 * (2 if dt == "bf16" else 4) * 2
            cells.append((f"decode B={B} {layout} {dt}", decode(B, layout, dt), size))

results = []
for name, make, size in cells:
    sets = sets_of(make, size)
    runs, chosen = {}, {}
    for label, target in targets.items():
        call = target.gdn_decode
        chosen[label] = call.prepare(**sets[0])
        call(**sets[0])
        runs[label] = [lambda s=s, call=call: call(**s) for s in sets]
    us = time_side_by_side(runs)
    rec = dict(cell=name, variant=chosen["main"], us=us, ratio=us["branchfree"] / us["main"])
    results.append(rec)
    print(json.dumps(rec), flush=True)
json.dump(results, open(sys.argv[1], "w"), indent=1)
