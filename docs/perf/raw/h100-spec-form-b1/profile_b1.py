"""Where the spec form's extra time at B = 1 goes (issue 18): one kernel variant, the three forms
of packed_forms.py (pos_dense, pos_packed, spec) on one input set, each called twice, for
Nsight Compute's per-instruction stall samples. Levers 1-4 of
docs/perf/h100-2026-11-25-spec-form-b1.md each removed a suspected wait and none moved the
time; this reads the waits instead of guessing them.

    python profile_b1.py [T] [bf16|fp32]        (default T = 8, bf16; from the repository root)

Under Nsight Compute, e.g.:

    ncu --clock-control none --kernel-name regex:decode_kernel --launch-skip 0 \
        --section WarpStateStats --section SourceCounters --section LaunchStats \
        --sampling-interval 0 --page source --print-source sass --csv \
        python docs/perf/raw/h100-spec-form-b1/profile_b1.py 8 bf16 > OUT.csv

Each form's second launch is the one to read (the first may pay for first touches).
"""

import sys
from pathlib import Path

import torch

from gdngen.problem import PackedProblem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "h100-packed"))
from packed_forms import FORMS, HV, form_args, h200  # noqa: E402  (the same three forms)

T = int(sys.argv[1]) if len(sys.argv) > 1 else 8
STATE = sys.argv[2] if len(sys.argv) > 2 else "bf16"

call = h200.gdn_decode
base = PackedProblem(sequences=1, tokens=T, state_dtype=STATE, H=16, HV=HV, null_slot=0)
forms = {name: form_args(base, name, seed=0) for name in FORMS}
for name, args in forms.items():
    print(name, call.prepare(**args), flush=True)
for name, args in forms.items():
    for _ in range(2):
        call(**args)
    torch.cuda.synchronize()
    print(name, "done", flush=True)
