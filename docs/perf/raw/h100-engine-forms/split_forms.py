"""Which part of vLLM's spec-decode form costs time at small batch: the same kernel timed side by
side on five forms of the same tokens (docs/perf/h100-2026-11-23-engine-forms.md, "Where the time
goes"). Run on the GPU machine: python split_forms.py OUT.json

pos_dense          q as [B, T], [B] slots, a positional [B, T, ...] intermediate buffer
pos_packed         the same with tokens packed [1, B*T] and cu_seqlens
table_dense        q as [B, T], vLLM's [B, T] per-token slot table with num_accepted_tokens
table_dense_nonat  the same without num_accepted_tokens (read from column 0)
spec               vLLM's form: packed tokens, the table and num_accepted_tokens
"""
import json, sys, torch
import generated.h200 as h200
from gdngen.problem import PackedProblem
from gdngen.measure.timing import rotating_sets, time_side_by_side

call = h200.gdn_decode
results = []
for (B, T, dt) in [(1, 2, "bf16"), (1, 8, "bf16"), (32, 4, "bf16"), (128, 8, "bf16"), (1, 4, "fp32")]:
    base = PackedProblem(sequences=B, tokens=T, state_dtype=dt, H=16, HV=64, null_slot=0)
    size = B * 64 * 128 * 128 * (2 if dt == "bf16" else 4) * (T + 1)
    count = rotating_sets(size)
    forms = {}
    for name in ["pos_dense", "pos_packed", "table_dense", "table_dense_nonat", "spec"]:
        sets = []
        for i in range(count):
            if name in ("pos_dense", "pos_packed"):
                a = base.with_(seed=i, slots="row", cache="positional", disable_state_update=True).make("cuda")
            else:
                a = base.with_(seed=i).make("cuda")
            if name in ("pos_dense", "table_dense", "table_dense_nonat"):
                for n, d in (("q", 16), ("k", 16), ("v", 64)):
                    a[n] = a[n].view(B, T, d, 128)
                for n in ("a", "b"):
                    a[n] = a[n].reshape(B, T, 64)
                del a["cu_seqlens"], a["max_seqlen"]
            if name == "table_dense_nonat":
                del a["num_accepted_tokens"]
            sets.append(a)
        try:
            v = call.prepare(**sets[0])
            call(**sets[0])
            forms[name] = [lambda s=s: call(**s) for s in sets]
        except Exception as e:
            print(name, "failed", repr(e)[:300], flush=True)
    t = time_side_by_side(forms)
    rec = dict(B=B, T=T, dtype=dt, variant=v, us=t)
    results.append(rec)
    print(json.dumps(rec), flush=True)
json.dump(results, open(sys.argv[1], "w"), indent=1)
