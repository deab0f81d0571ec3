"""Is the spec form's B = 1 gap the kernel's, or where its slots lie? (issue 18)

Levers 1-4 of docs/perf/h100-2026-11-25-spec-form-b1.md each removed a wait inside the kernel
and none moved the time. This times the same kernel on the same tokens with the slot table's
contents varied, beside the forms of packed_forms.py, side by side per cell
(gdngen.measure.timing):

pos_dense   q as [B, T], [B] slots, a positional [B, T, ...] buffer (packed_forms.py)
pos_packed  the same tokens packed [1, B*T] with cu_seqlens (packed_forms.py)
spec        vLLM's spec-decode form, random pool slots, num_accepted_tokens = 1 at B = 1:
            the initial state is read from the slot token 0's state is written to
spec_seq    spec with each row's slots consecutive and ascending (slot 1 + n*T + t)
spec_far    spec read from a table column no token writes (a [N, T + 1] table, all accepted)
spec_dense  spec with dense [B, T] tokens (no cu_seqlens): the slot table without the packing

spec, spec_seq and spec_far are one compiled kernel; only the table's contents differ.

    python slot_patterns.py OUT.jsonl [compile [CELL]]     (from the repository root)

``compile`` only calls each form once (to fill the kernel cache); CELL (an index into CELLS)
compiles one cell, so that several processes can share the work. ``FORMS=a,b,...`` in the
environment times only those forms.
"""

import json
import os
import sys
from pathlib import Path

import torch

from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import PackedProblem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "h100-packed"))
from packed_forms import HV, form_args, h200  # noqa: E402  (pos_dense, pos_packed, spec)

CELLS = [(1, 2, "bf16"), (1, 4, "bf16"), (1, 8, "bf16"), (1, 4, "fp32"), (32, 8, "bf16")]
ALL_FORMS = "pos_dense,pos_packed,spec,spec_seq,spec_far,spec_dense"
FORMS = os.environ.get("FORMS", ALL_FORMS).split(",")


def dense_tokens(args: dict, B: int, T: int) -> dict:
    """A packed call's arguments with the tokens as [B, T, ...] and no cu_seqlens."""
    for name, heads in (("q", 16), ("k", 16), ("v", HV)):
        args[name] = args[name].view(B, T, heads, 128)
    for name in ("a", "b"):
        args[name] = args[name].reshape(B, T, HV)
    del args["cu_seqlens"], args["max_seqlen"]
    return args


def pattern_args(base: PackedProblem, name: str, seed: int) -> dict:
    B, T = base.sequences, base.tokens
    if name in ("pos_dense", "pos_packed", "spec"):
        return form_args(base, name, seed)
    if name == "spec_far":
        args = base.with_(seed=seed, wide_table=1).make("cuda")
        args["num_accepted_tokens"].fill_(T + 1)
        return args
    args = base.with_(seed=seed).make("cuda")
    if name == "spec_seq":
        slots = torch.arange(1, 1 + B * T, device="cuda").view(B, T)
        args["initial_state_indices"].copy_(slots.to(args["initial_state_indices"].dtype))
        return args
    assert name == "spec_dense", name
    return dense_tokens(args, B, T)


def main() -> None:
    call = h200.gdn_decode
    compile_only = len(sys.argv) > 2 and sys.argv[2] == "compile"
    cells = CELLS
    if compile_only and len(sys.argv) > 3:
        cells = [CELLS[int(sys.argv[3])]]
    with open(sys.argv[1], "w") as log:
        for B, T, dt in cells:
            base = PackedProblem(sequences=B, tokens=T, state_dtype=dt, H=16, HV=HV, null_slot=0)
            size = B * HV * 128 * 128 * (2 if dt == "bf16" else 4) * (T + 1)
            count = 1 if compile_only else rotating_sets(size)
            runs, variants = {}, {}
            for name in FORMS:
                sets = [pattern_args(base, name, i) for i in range(count)]
                variants[name] = call.prepare(**sets[0])
                call(**sets[0])
                runs[name] = [lambda s=s: call(**s) for s in sets]
            if compile_only:
                print(B, T, dt, "compiled", variants, flush=True)
                continue
            rec = dict(B=B, T=T, dtype=dt, HV=HV, variants=variants, us=time_side_by_side(runs))
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
