"""The B = 1 forms for Nsight Compute (prof.sh): dense, vLLM's spec form, and the spec form with
dense rows, on one input set each, each called 1 + N times (the first call is a warm-up that
summarize_many.py skips).

    python profile_many.py T STATE_DTYPE N      (from the repository root)
"""

import sys
from pathlib import Path

import torch

from gdngen.problem import PackedProblem

raw = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(raw / "h100-packed"))
sys.path.insert(0, str(raw / "h100-spec-form-b1"))
from packed_forms import HV, form_args, h200  # noqa: E402
from slot_patterns import dense_tokens  # noqa: E402

T, STATE, N = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
base = PackedProblem(sequences=1, tokens=T, state_dtype=STATE, H=16, HV=HV, null_slot=0)
forms = {name: form_args(base, name, seed=0) for name in ("pos_dense", "spec")}
forms["spec_dense"] = dense_tokens(base.with_(seed=0).make("cuda"), 1, T)
call = h200.gdn_decode
for name, args in forms.items():
    print(name, call.prepare(**args), file=sys.stderr, flush=True)
for name, args in forms.items():
    for _ in range(1 + N):
        call(**args)
    torch.cuda.synchronize()
