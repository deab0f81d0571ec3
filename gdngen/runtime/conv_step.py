"""The split plan of a fused-core call: the conv1d step as a kernel of its own, then the decode
kernel without the prologue (docs/design.md, "The conv1d step apart").

A dispatch rule with ``split_conv`` names the decode variant that runs after the step. The plan
holds both kernels and the workspace between them: the convolved q, k and v rows, in q's dtype,
as one ``[lead, tokens, 2HK + HV*V]`` buffer per plan (the conv's channel order), made when a
signature is planned and grown (never freed: a captured CUDA graph may hold it) only outside a
capture. The launch hands the decode kernel views of it in place of q, k and v, and no conv
tensors.

Calls of one signature running at once on different streams would share the workspace; as with
the states themselves, an engine runs a layer's calls in order on one stream.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import torch

from gdngen.terms import conv_step_name

from .arg_checks import VECTOR_ALIGN
from .compile import CompileKey, fake_arguments
from .kernel_args import KERNEL_ARGS, LAUNCH_ONLY_ARGS

#: the conv step's parameters, in ``launch``'s order (gdngen.device.conv_step), and where each
#: comes from: a decode kernel's run-time argument of that name, the workspace, or a size
INPUTS = ("q", "k", "v")
OUTPUTS = ("q_out", "k_out", "v_out")
INDICES = ("read_slots", "write_slots", "num_accepted", "cu_seqlens", "cache_rows")
SIZES = ("pool_size", "cache_count")
CONV = ("conv_state", "conv_weight", "conv_bias", "conv_windows")
OPTIONS = (
    "T", "null_slot", "per_token_slots", "uniform_rows", "write_state", "conv_activation", "pdl",
    "channels_last",
)  # fmt: skip


def conv_step_module(kernels_package: str, arch: str) -> str:
    return f"{kernels_package}.{conv_step_name(arch)}"


def conv_step_key(key: CompileKey, variant: str, channels_last: bool) -> CompileKey:
    """The conv step's key from the call's (with the prologue), for a conv state that
    :func:`moves_in_vectors` or not: what the step does not read is set to one value, so that
    calls differing only there share one binary."""
    return replace(
        key, variant=variant, gate_dtype="fp32", dt_bias_dtype="fp32", state_dtype="fp32",
        use_qk_l2norm=False, exact_slot_table=False, norm_activation=None, norm_weight_dtype=None,
        conv_channels_last=channels_last,
    )  # fmt: skip


def moves_in_vectors(conv_state: torch.Tensor) -> bool:
    """Whether the conv step may move this conv state in 16-byte vectors
    (CompileKey.conv_channels_last): channels-last (D contiguous), its slot and column strides
    whole vectors and its base 16-byte aligned. Its channel count is a whole number of vectors
    by the checks (2HK + HV*V, with K and V multiples of the io vector), and the call's
    signature holds the base's alignment, so a later call of the signature proves it too."""
    vector = VECTOR_ALIGN // conv_state.element_size()
    slot_stride, channel_stride, column_stride = conv_state.stride()
    return (
        channel_stride == 1
        and slot_stride % vector == 0
        and column_stride % vector == 0
        and conv_state.data_ptr() % VECTOR_ALIGN == 0
    )


def without_prologue(key: CompileKey) -> CompileKey:
    """The decode kernel's key in the split plan: the call's, without the conv1d prologue."""
    return replace(key, conv_width=None, conv_bias=False, conv_activation=None)


def fake_conv_step_arguments(key: CompileKey) -> list:
    """Stand-ins for the conv step's ``launch`` arguments (its order: INPUTS, OUTPUTS, INDICES,
    SIZES, CONV, OPTIONS, ``launch_pdl``, the stream), from the decode kernel's stand-ins for
    the same key."""
    import cutlass

    # The recurrent pool's layout does not matter: the step reads no state, only its size.
    names = [arg.name for arg in KERNEL_ARGS + LAUNCH_ONLY_ARGS] + ["stream"]
    inputs = dict(zip(names, fake_arguments(key, "k_last")))
    outputs = dict(zip(names, fake_arguments(key, "k_last")))
    sizes = [cutlass.Int64(0) for _ in SIZES]  # run-time values: any stands in
    options = dict(
        T=key.tokens, null_slot=key.null_slot, per_token_slots=key.per_token_slots,
        uniform_rows=key.uniform_rows, write_state=key.write_final_state or key.per_token_slots,
        conv_activation=key.conv_activation, pdl=key.pdl, channels_last=key.conv_channels_last,
    )  # fmt: skip
    return [
        *(inputs[name] for name in INPUTS),
        *(outputs[name] for name in INPUTS),
        *(inputs[name] for name in INDICES),
        *sizes,
        *(inputs[name] for name in CONV),
        *(options[name] for name in OPTIONS),
        inputs["launch_pdl"],
        inputs["stream"],
    ]


class ConvRows:
    """The workspace of one plan: the convolved rows, and views of it as q, k and v."""

    def __init__(self, H: int, K: int, HV: int, V: int, dtype: torch.dtype, device) -> None:
        self.H, self.K, self.HV, self.V = H, K, HV, V
        self.channels = 2 * H * K + HV * V
        self.dtype, self.device = dtype, device
        self._buffers: list[torch.Tensor] = []  # every buffer made, the newest last
        self._views: dict[tuple[int, int], tuple] = {}
        self._lock = threading.Lock()

    def views(self, lead: int, tokens: int) -> tuple:
        """(q, k, v) views of ``[lead, tokens]`` rows of the workspace."""
        found = self._views.get((lead, tokens))
        if found is None:
            with self._lock:
                found = self._views[(lead, tokens)] = self._make_views(lead, tokens)
        return found

    def _make_views(self, lead: int, tokens: int) -> tuple:
        size = lead * tokens * self.channels
        if not self._buffers or self._buffers[-1].numel() < size:
            if (
                torch.device(self.device).type == "cuda"
                and torch.cuda.is_current_stream_capturing()
            ):
                raise RuntimeError(
                    f"mixed_qkv: the split conv plan needs a workspace of {lead} x {tokens} "
                    "token rows, more than this signature was planned with; a CUDA graph "
                    "capture cannot allocate it. Call gdn_decode once with the largest token "
                    "count before capturing"
                )
            self._buffers.append(torch.empty(size, dtype=self.dtype, device=self.device))
        rows = self._buffers[-1][:size].view(lead, tokens, self.channels)
        HK = self.H * self.K
        return (
            rows[..., :HK].unflatten(-1, (self.H, self.K)),
            rows[..., HK : 2 * HK].unflatten(-1, (self.H, self.K)),
            rows[..., 2 * HK :].unflatten(-1, (self.HV, self.V)),
        )
