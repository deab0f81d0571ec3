"""One decode-core cell: a call with the conv1d prologue and the gated RMSNorm epilogue in vLLM's
call forms, its inputs, its least bytes and its check against the float64 reference. The core
bench (gdngen.bench.core) and the core tune (gdngen.tune.core) build their calls here, so that
what the tune ranks is what the bench times.

T = 1 is decode (``[B]`` slots, one token a request: the call takes the rows as ``[B, D]``
with no ``cu_seqlens``, as vLLM's conv update and packed-decode recurrence take its all-decode
batch); T > 1 is speculative verify (a ``[B, T]`` per-token slot table with
``num_accepted_tokens``, the tokens packed with ``cu_seqlens``), whose every token's state is
written to its slot. The rows are one pre-conv ``mixed_qkv`` projection; slot 0 is vLLM's null
slot. A set keeps every cell's tensors in the packed form (``[1, B * T, ...]`` with
``cu_seqlens``), which the reference reads; :func:`call_form` gives the call its views.
"""

from __future__ import annotations

import torch

from gdngen.problem import TORCH_DTYPES, PackedProblem
from gdngen.reference.core import reference_core_call

#: the gated RMSNorm's epsilon in every core cell
EPS = 1e-6
CONV_LAYOUTS = ("channels_last", "channels_first")
#: sequences of a cell the check compares (the first few and the last)
CHECK_SEQUENCES = 4


def core_problem(batch: int, tokens: int, HV: int, state_dtype: str, *, H: int = 16,
                 K: int = 128, V: int = 128, layout: str = "k_last") -> PackedProblem:  # fmt: skip
    """vLLM's form of the cell: [B] slots at T = 1, a per-token table at T > 1, slot 0 null."""
    return PackedProblem(
        sequences=batch, tokens=tokens, H=H, HV=HV, K=K, V=V, layout=layout,
        state_dtype=state_dtype, mixed_qkv=True, slots="per_token" if tokens > 1 else "row",
    )  # fmt: skip


def core_bytes(problem: PackedProblem, conv_width: int) -> int:
    """The least bytes a core call moves: the recurrent states read and written (every token's
    at T > 1), the pre-conv rows and the output, and :func:`steps_bytes`."""
    B, T, H, HV, K, V = (problem.sequences, problem.tokens, problem.H, problem.HV, problem.K,
                         problem.V)  # fmt: skip
    channels = 2 * H * K + HV * V
    state = B * HV * K * V * TORCH_DTYPES[problem.state_dtype].itemsize
    return state * (1 + T) + B * T * (channels + HV * V) * 2 + steps_bytes(problem, conv_width)


def steps_bytes(problem: PackedProblem, conv_width: int) -> int:
    """The bytes the conv and the norm add to the recurrence's: the conv state's window read
    and its new columns written, and z read."""
    B, T, H, HV, K, V = (problem.sequences, problem.tokens, problem.H, problem.HV, problem.K,
                         problem.V)  # fmt: skip
    channels = 2 * H * K + HV * V
    conv = B * channels * 2 * (2 * (conv_width - 1) + (T - 1))
    return conv + B * T * HV * V * 2


def core_inputs(problem: PackedProblem, seed: int, *, conv_width: int = 4,
                conv_layout: str = "channels_last") -> dict:  # fmt: skip
    """One input set: ``args`` (gdn_decode's arguments on the pre-conv rows), ``z``,
    ``norm_weight``, ``output``, and the conv's ``conv_state`` (in ``conv_layout``: vLLM's view
    of a ``[slots, columns, D]`` buffer, or a dense ``[slots, D, columns]`` pool, of W - 2 + T
    columns), ``conv_weight`` and ``conv_bias``."""
    if conv_layout not in CONV_LAYOUTS:
        raise ValueError(f"conv_layout: expected one of {CONV_LAYOUTS}; got {conv_layout!r}")
    args = problem.with_(seed=seed).make("cuda")
    gen = torch.Generator(device="cuda").manual_seed(10_000 + seed)
    B, T, H, HV, K, V = (problem.sequences, problem.tokens, problem.H, problem.HV, problem.K,
                         problem.V)  # fmt: skip
    channels = 2 * H * K + HV * V

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * std).to(torch.bfloat16)

    args["mixed_qkv"] = randn(1, B * T, channels)
    s = dict(
        args=args,
        z=randn(1, B * T, HV, V),
        norm_weight=(1 + 0.1 * torch.randn(V, generator=gen, device="cuda")).to(torch.bfloat16),
        output=torch.empty(1, B * T, HV, V, dtype=torch.bfloat16, device="cuda"),
    )
    slots = args["initial_state"].shape[0]
    columns = conv_width - 2 + T
    if conv_layout == "channels_last":  # vLLM's default: [slots, columns, D], viewed
        pool = randn(slots, columns, channels).transpose(1, 2)
    else:
        pool = randn(slots, channels, columns)
    s.update(
        conv_state=pool,
        conv_weight=randn(channels, conv_width, std=0.5),
        conv_bias=randn(channels, std=0.2),
    )
    return s


def core_kwargs(s: dict) -> dict:
    """The set's fused-core call: every keyword of ``gdn_decode``, in the cell's call form."""
    return call_form(
        dict(
            s["args"], conv_state=s["conv_state"], conv_weight=s["conv_weight"],
            conv_bias=s["conv_bias"], z=s["z"], norm_weight=s["norm_weight"], norm_eps=EPS,
            output=s["output"],
        )  # fmt: skip
    )


def call_form(kwargs: dict) -> dict:
    """``gdn_decode``'s keywords of a set's call in the cell's engine form: at T = 1 vLLM's
    all-decode form, the rows ``[B, D]`` (z and the output ``[B, HV, V]``) without
    ``cu_seqlens``, views of the set's packed tensors; a verify cell's as they are. A packed
    call places each row's token from ``cu_seqlens``, so its loads wait for that load: 14% of
    the bf16 recurrence's time at HV 64, B 512 on an H200
    (docs/perf/h200-2026-11-28-decode-form.md), which vLLM's decode chain does not pay."""
    if kwargs.get("max_seqlen") != 1 or kwargs.get("num_accepted_tokens") is not None:
        return kwargs
    dense = {k: v for k, v in kwargs.items() if k not in ("cu_seqlens", "max_seqlen")}
    for name in ("mixed_qkv", "z", "output"):
        if dense.get(name) is not None:
            dense[name] = dense[name][0]
    return dense


def _relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


class CoreCheck:
    """A set's core call checked against the float64 reference
    (:func:`gdngen.reference.core.reference_core_call`) over a few of its sequences, the
    reference computed once for every call checked on the set."""

    def __init__(self, s: dict, problem: PackedProblem) -> None:
        args = s["args"]
        self.s = s
        self.before = args["initial_state"].clone()
        self.conv_before = s["conv_state"].clone()
        B = problem.sequences
        picked = sorted({*range(min(B, CHECK_SEQUENCES - 1)), B - 1})
        self.expected = reference_core_call(
            dict(args, conv_state=self.conv_before, conv_weight=s["conv_weight"],
                 conv_bias=s["conv_bias"], initial_state=self.before),
            s["z"], s["norm_weight"], H=problem.H, K=problem.K, eps=EPS, sequences=picked,
        )  # fmt: skip
        cu = args["cu_seqlens"].long().tolist()
        device = s["output"].device
        self.tokens = torch.cat([torch.arange(cu[n], cu[n + 1]) for n in picked]).to(device)
        table = args["initial_state_indices"].long()
        written = table[picked].flatten()
        self.written = written[written > args.get("null_slot", 0)]
        self.conv_slots = table[picked, 0] if table.dim() == 2 else table[picked]

    def error(self, call) -> float:
        """Run ``call`` once on the set's core call and return its largest relative error: the
        output, the recurrent states the call wrote and the conv states. Both pools are restored
        after, so the set's timings start from the same states."""
        s, ref = self.s, self.expected
        pool, conv_pool = s["args"]["initial_state"], s["conv_state"]
        call(**core_kwargs(s))
        if pool.is_cuda:
            torch.cuda.synchronize()
        errors = [
            _relative(s["output"][:, self.tokens], ref.output[:, self.tokens]),
            _relative(pool[self.written], ref.pool[self.written]),
            _relative(conv_pool[self.conv_slots], ref.conv_pool[self.conv_slots]),
        ]
        pool.copy_(self.before)
        conv_pool.copy_(self.conv_before)
        return max(errors)
