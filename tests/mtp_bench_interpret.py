"""The fused MTP bench's check (gdngen.bench.mtp.check_cell) on the bench's own inputs
(gdngen.bench.mtp_inputs), with vLLM's Triton port of the op run by Triton's interpreter on the
CPU and gdngen's adapter over the float64 stand-in of gdn_decode (tests.vllm_mtp): the port
takes the inputs as the bench draws them (its asserts on shapes and strides hold), and the check
finds the two in agreement. Run in a fresh process with ``TRITON_INTERPRET=1``
(tests/test_mtp_bench_cpu.py does):

    TRITON_INTERPRET=1 python -m tests.mtp_bench_interpret VLLM_SRC

Prints one JSON line per cell: the check's relative errors. Small heads keep the interpreter
quick; the bf16 activations are recast to fp32 with their strides (the interpreter mishandles
bf16 arithmetic), and the interpreter rounds a bf16 state toward zero (tests/vllm_mtp_interpret.py).
"""

from __future__ import annotations

import json
import sys

import torch

from gdngen.bench.mtp import check_cell
from gdngen.bench.mtp_inputs import MtpCell, mtp_set, parameters
from gdngen.engines.vllm import VllmGdn
from gdngen.measure.vllm_kernels import vllm_kernels
from tests.vllm_interpret import _work_around_the_interpreter
from tests.vllm_mtp import _recast, reference_gdn_decode

CELLS = [
    MtpCell(batch=5, tokens=tokens, HV=4, state_dtype=dtype, H=2, K=64, V=64)
    for dtype in ("fp32", "bf16")
    for tokens in (2, 4)
]


def main(source: str) -> None:
    kernels = vllm_kernels(source)
    if isinstance(kernels, str):
        raise SystemExit(kernels)
    _work_around_the_interpreter()
    port = sys.modules["vllm.third_party.flash_linear_attention.ops.fused_gdn_decode_post_conv_mtp"]
    port.num_compute_units = lambda device_id: 132  # an H100's; no device here
    adapter = VllmGdn(reference_gdn_decode).fused_gdn_decode_post_conv_mtp
    for seed, cell in enumerate(CELLS):
        s = mtp_set(cell, parameters(cell, "cpu"), seed, "cpu")
        for name in ("mixed_qkv", "a", "b", "output_gate", "out"):
            s[name] = _recast(s[name], torch.float32)
        errors = check_cell(s, kernels.mtp_decode, adapter, cell.state_dtype)
        print(
            json.dumps(dict(state_dtype=cell.state_dtype, tokens=cell.tokens, **errors)), flush=True
        )


if __name__ == "__main__":
    main(sys.argv[1])
