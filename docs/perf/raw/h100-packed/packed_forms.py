"""What packing a call with cu_seqlens costs, per cell: one dispatched kernel timed side by side
(gdngen.measure.timing) on three forms of the same tokens (docs/perf/h100-2026-11-24-packed-rows.md).
Run once per build (before and after a change, each from its own tree), from the repository root:

    python packed_forms.py OUT.jsonl [compile]

``compile`` only calls each form once (to fill the kernel cache, e.g. in parallel with another
build's); without it, one JSON line per cell. ``PACKED_CELLS`` ("B,T,dtype;...") replaces CELLS.

pos_dense   q as [B, T], [B] slots, a positional [B, T, ...] intermediate buffer (no final write)
pos_packed  the same tokens packed [1, B*T] with cu_seqlens
spec        vLLM's spec-decode form: packed, a [B, T] slot table with num_accepted_tokens,
            slot 0 as padding (at T = 1 vLLM's plain decode: packed, [B] slots)
"""

import json
import os
import sys

import generated.h200 as h200
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import PackedProblem

CELLS = [
    (1, 1, "bf16"), (1, 2, "bf16"), (1, 4, "bf16"), (1, 8, "bf16"), (32, 1, "bf16"),
    (32, 4, "bf16"), (32, 8, "bf16"), (128, 8, "bf16"), (512, 2, "bf16"), (1, 4, "fp32"),
    (1, 8, "fp32"), (32, 4, "fp32"),
]  # fmt: skip
if os.environ.get("PACKED_CELLS"):
    CELLS = [
        (int(B), int(T), dt)
        for B, T, dt in (c.split(",") for c in os.environ["PACKED_CELLS"].split(";"))
    ]
FORMS = ["pos_dense", "pos_packed", "spec"]
HV = 64


def form_args(base: PackedProblem, name: str, seed: int) -> dict:
    """gdn_decode's arguments for one input set of ``base`` in form ``name`` (FORMS)."""
    B, T = base.sequences, base.tokens
    if name == "spec":
        return base.with_(seed=seed, slots="row" if T == 1 else "per_token").make("cuda")
    a = base.with_(seed=seed, slots="row", cache="positional", disable_state_update=True).make(
        "cuda"
    )
    if name == "pos_dense":
        for n, d in (("q", 16), ("k", 16), ("v", base.HV)):
            a[n] = a[n].view(B, T, d, 128)
        for n in ("a", "b"):
            a[n] = a[n].reshape(B, T, base.HV)
        del a["cu_seqlens"], a["max_seqlen"]
    return a


def main() -> None:
    call = h200.gdn_decode
    compile_only = len(sys.argv) > 2 and sys.argv[2] == "compile"
    with open(sys.argv[1], "w") as log:
        for B, T, dt in CELLS:
            base = PackedProblem(sequences=B, tokens=T, state_dtype=dt, H=16, HV=HV, null_slot=0)
            size = B * HV * 128 * 128 * (2 if dt == "bf16" else 4) * (T + 1)
            count = 1 if compile_only else rotating_sets(size)
            forms, variants = {}, {}
            for name in FORMS:
                sets = [form_args(base, name, i) for i in range(count)]
                variants[name] = call.prepare(**sets[0])
                call(**sets[0])
                forms[name] = [lambda s=s: call(**s) for s in sets]
            if compile_only:
                print(B, T, dt, "compiled", flush=True)
                continue
            rec = dict(B=B, T=T, dtype=dt, HV=HV, variants=variants, us=time_side_by_side(forms))
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
