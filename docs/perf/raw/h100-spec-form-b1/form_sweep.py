"""Which kernel serves each form best at B = 1 (issue 18): every K-last variant of the state dtype,
pinned (``h200.variant``), on the dense positional form and on vLLM's spec-decode form of the same
tokens (packed_forms.py's pos_dense and spec), all side by side per cell
(gdngen.measure.timing), beside both forms as dispatched. Today one rule serves both forms (the
dispatch keys verify and spec alike as ``intermediate``); this says whether the spec form at
B = 1 would want a kernel of its own.

    python form_sweep.py OUT.jsonl [compile CELL]     (from the repository root)

``compile CELL`` calls each entry of one cell once (to fill the kernel cache), so that one
process a cell can share the work. Environment (optional): ``SWEEP_CELLS`` ("B,T,dtype;..."),
``SWEEP_FORMS`` (packed_forms.py's form names, comma-separated), ``SWEEP_VARIANTS`` (the
variant names to keep, comma-separated; all K-last variants of the dtype without it).
"""

import os

import json
import sys
from pathlib import Path

from gdngen.bench.contenders import pair_variants
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import PackedProblem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "h100-packed"))
from packed_forms import HV, form_args, h200  # noqa: E402

CELLS = [(1, 2, "bf16"), (1, 4, "bf16"), (1, 8, "bf16"), (1, 2, "fp32"), (1, 4, "fp32"),
         (1, 8, "fp32")]  # fmt: skip
FORMS = ("pos_dense", "spec")
if os.environ.get("SWEEP_CELLS"):
    CELLS = [
        (int(B), int(T), dt)
        for B, T, dt in (c.split(",") for c in os.environ["SWEEP_CELLS"].split(";"))
    ]
if os.environ.get("SWEEP_FORMS"):
    FORMS = tuple(os.environ["SWEEP_FORMS"].split(","))
KEEP = set(filter(None, os.environ.get("SWEEP_VARIANTS", "").split(",")))


def main() -> None:
    compile_only = len(sys.argv) > 2 and sys.argv[2] == "compile"
    cells = [CELLS[int(sys.argv[3])]] if compile_only else CELLS
    with open(sys.argv[1], "w") as log:
        for B, T, dt in cells:
            base = PackedProblem(sequences=B, tokens=T, state_dtype=dt, H=16, HV=HV, null_slot=0)
            size = B * HV * 128 * 128 * (2 if dt == "bf16" else 4) * (T + 1)
            count = 1 if compile_only else rotating_sets(size)
            sets = {form: [form_args(base, form, i) for i in range(count)] for form in FORMS}
            calls = {"dispatched": h200.gdn_decode}
            calls.update(
                {
                    name: h200.variant(name)
                    for name in pair_variants(h200, "k_last", dt, (128, 128))
                    if not KEEP or name in KEEP
                }
            )
            runs, dispatched = {}, {}
            for form in FORMS:
                dispatched[form] = h200.gdn_decode.prepare(**sets[form][0])
                for name, call in calls.items():
                    try:
                        call(**sets[form][0])
                    except Exception as exc:  # a variant that refuses the form or the cell
                        print(form, name, "refused:", exc, flush=True)
                        continue
                    runs[f"{form}:{name}"] = [lambda c=call, s=s: c(**s) for s in sets[form]]
            if compile_only:
                print(B, T, dt, "compiled", len(runs), flush=True)
                continue
            rec = dict(B=B, T=T, dtype=dt, HV=HV, dispatched=dispatched, us=time_side_by_side(runs))
            log.write(json.dumps(rec) + "\n")
            log.flush()
            best = {f: min((v, k) for k, v in rec["us"].items() if k.startswith(f)) for f in FORMS}
            print(B, T, dt, best, flush=True)


if __name__ == "__main__":
    main()
