"""vLLM's Triton port of its fused MTP op, run by Triton's interpreter on the CPU, beside
gdngen's adapter of the op over the float64 stand-in of gdn_decode (tests.vllm_mtp): both
against the float64 reference, and against each other, on vLLM's inputs. Where there is no GPU
this checks the reading of the op (which slot a row reads, which it writes, what padding means,
the norm) and the adapter's mapping onto gdn_decode's semantics. Run in a fresh process with
``TRITON_INTERPRET=1`` (tests/test_vllm_chain_cpu.py does):

    TRITON_INTERPRET=1 python -m tests.vllm_mtp_interpret VLLM_SRC

Prints one JSON line per case. The interpreter's limits are worked around as in
tests/vllm_interpret.py: fp32 activations (it mishandles bf16 arithmetic), ``range`` over a
loaded scalar, and the SM count (no device). It also rounds an fp32 value stored to a bf16 state
toward zero (a GPU rounds to nearest), so the port's bf16 states are held against the reference
rounded that way.
"""

from __future__ import annotations

import json
import sys

import torch

from gdngen.engines.vllm import VllmGdn
from gdngen.measure.vllm_kernels import vllm_kernels
from tests.vllm_interpret import _work_around_the_interpreter
from tests.vllm_mtp import (
    MtpCase,
    MtpExpected,
    check_mtp,
    expected_mtp,
    fresh,
    mtp_args,
    reference_gdn_decode,
)

# Small heads keep the interpreter quick; the port takes any power-of-two K and V >= 64.
SMALL = dict(H=2, HV=4, K=64, V=64)
CASES = [
    MtpCase(sequences=6, tokens=1, state_dtype="bf16", mixed_lengths=False, seed=1, **SMALL),
    MtpCase(sequences=7, tokens=2, state_dtype="fp32", activation="sigmoid", seed=2, **SMALL),
    MtpCase(sequences=9, tokens=3, state_dtype="bf16", seed=3, **SMALL),
    MtpCase(sequences=9, tokens=4, state_dtype="fp32", mixed_lengths=False, seed=4, **SMALL),
    MtpCase(sequences=9, tokens=4, state_dtype="bf16", activation="sigmoid", seed=5, **SMALL),
]


def toward_zero(states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 states stored as the interpreter stores them: to fp32, then to bf16 by dropping
    the low 16 bits."""
    single = states.float()
    if dtype != torch.bfloat16:
        return single.to(dtype)
    return (single.view(torch.int32) & -65536).view(torch.float32).to(dtype)


def relative(got, expected) -> float:
    keep = ~torch.isnan(expected.double())
    got, expected = got.double()[keep], expected.double()[keep]
    return float((got - expected).norm() / expected.norm().clamp_min(1e-30))


def main(source: str) -> None:
    kernels = vllm_kernels(source)
    if isinstance(kernels, str):
        raise SystemExit(kernels)
    _work_around_the_interpreter()
    port = sys.modules["vllm.third_party.flash_linear_attention.ops.fused_gdn_decode_post_conv_mtp"]
    port.num_compute_units = lambda device_id: 132  # an H100's; no device here
    adapter = VllmGdn(reference_gdn_decode)
    for case in CASES:
        args = mtp_args(case, "cpu", io_dtype=torch.float32)
        pool_before = args["state"].clone()
        exact = expected_mtp(dict(args, state=pool_before.double()), case)  # nothing rounded
        dtype = pool_before.dtype
        theirs, ours = fresh(args), fresh(args)
        returned = kernels.mtp_decode(**theirs)
        assert returned is theirs["out"]
        stored = MtpExpected(exact.output, toward_zero(exact.pool, dtype))
        check_mtp("vLLM's Triton port", theirs, stored, pool_before)
        returned = adapter.fused_gdn_decode_post_conv_mtp(**ours)
        assert returned is ours["out"]
        check_mtp("the adapter", ours, MtpExpected(exact.output, exact.pool.to(dtype)), pool_before)
        same_slots = torch.equal(
            (theirs["state"] != pool_before).flatten(1).any(1),
            (ours["state"] != pool_before).flatten(1).any(1),
        )
        print(json.dumps(dict(
            case=[case.sequences, case.tokens, case.state_dtype, case.activation],
            output=relative(ours["out"], theirs["out"]),
            state=relative(ours["state"], theirs["state"]),
            same_slots=same_slots,
            same_untouched_rows=torch.equal(
                torch.isnan(ours["out"]), torch.isnan(theirs["out"])
            ),
        )), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
