"""Engine adapters: a target's ``gdn_decode`` behind the GDN decode entry points that vLLM and
SGLang call today, with those engines' own argument names, shapes and padding conventions
(docs/engines.md).

An adapter only renames arguments, picks the call form and refuses what gdngen does not do; the
checks, the dispatch and the launch are the target's (docs/design.md, "Call forms"). It allocates
nothing beyond what ``gdn_decode`` does (the output when none is given) and never reads a tensor
back to the host: every value it derives (the sequence count, ``max_seqlen``) comes from shapes.

    from generated.h200 import gdn_decode
    from gdngen.engines.vllm import VllmGdn

    gdn = VllmGdn(gdn_decode)
    gdn.fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv=..., ...)

An error raised by ``gdn_decode`` about an argument the engine passed under another name is
raised again under the engine's name, e.g. ``ssm_state_indices (gdn_decode's
initial_state_indices): ...``.
"""

from __future__ import annotations

from typing import Callable, Mapping

__all__ = [
    "EngineAdapter",
    "SglangGdn",
    "VllmGdn",
    "leading_rows",
    "token_gates",
    "vllm_token_bound",
]


class EngineAdapter:
    """What both engines' adapters share: the target's call and the renaming of its errors."""

    #: slots <= this are padding rows (zero output, no state read or written)
    null_slot = -1

    def __init__(self, gdn_decode: Callable) -> None:
        if not callable(gdn_decode):
            raise TypeError(
                f"gdn_decode: expected a target's call (generated.<target>.gdn_decode); "
                f"got {type(gdn_decode).__name__}"
            )
        self.gdn_decode = gdn_decode

    def __repr__(self) -> str:
        name = getattr(self.gdn_decode, "__name__", type(self.gdn_decode).__name__)
        return f"{type(self).__name__}({name})"

    def fused_recurrent_gated_delta_rule_packed_decode(
        self,
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        scale,
        initial_state,
        out,
        ssm_state_indices,
        use_qk_l2norm_in_kernel=False,
        *,
        state_scales=None,
    ):
        """One token per request: ``mixed_qkv [B, 2*H*K + HV*V]`` (rows may be strided), ``a``,
        ``b [B, HV]``, the pool ``initial_state [slots, HV, V, K]`` updated in place at
        ``ssm_state_indices [B]`` (<= ``null_slot``: padding, zero output), the output written
        into ``out [B, 1, HV, V]``. Returns ``(out, initial_state)``, as the engine's op does.
        Both engines' ops take the same arguments; only their padding slot differs. With an int8
        or fp8 pool, ``state_scales [slots, HV, V]`` (keyword only, an addition) holds its rows'
        scales (docs/engines.md, "A quantized state")."""
        return self._launch(
            _PACKED_NAMES,
            dict(
                mixed_qkv=mixed_qkv,
                a=a,
                b=b,
                A_log=A_log,
                dt_bias=dt_bias,
                scale=scale,
                output=out,
                use_qk_l2norm=use_qk_l2norm_in_kernel,
                initial_state=initial_state,
                initial_state_indices=ssm_state_indices,
                null_slot=self.null_slot,
                state_scales=state_scales,
            ),
        )

    def decode_core(
        self,
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        ssm_state,
        ssm_state_indices,
        conv_state,
        conv_weights,
        conv_bias,
        z,
        norm_weight,
        norm_eps=1e-6,
        *,
        activation="silu",
        norm_activation="silu",
        scale=None,
        num_accepted_tokens=None,
        query_start_loc=None,
        max_query_len=None,
        out=None,
        use_qk_l2norm_in_kernel=True,
        intermediate_states_buffer=None,
        intermediate_state_indices=None,
        intermediate_conv_window=None,
        disable_state_update=False,
        uniform_seqlen=False,
        state_scales=None,
        intermediate_states_scales=None,
    ):
        """The layer's whole decode core in one kernel (docs/engines.md, "The fused core"): the
        causal conv1d update on the pre-conv ``mixed_qkv``, the gated delta recurrence, and the
        gated RMSNorm of its output, where the engine runs three kernels.

        - ``mixed_qkv``: ``[B, D]`` (one token a request), or with ``query_start_loc [N + 1]``
          the packed ``[total_tokens, D]``, D = 2*H*K + HV*V; rows may be strided. ``a``, ``b``:
          ``[tokens, HV]``; ``z``: ``[tokens, HV, V]``; ``out`` (optional): ``[tokens, HV, V]``.
        - ``ssm_state [slots, HV, V, K]`` and ``conv_state [slots, D, columns]`` (the engine's
          views, updated in place) share the slots of ``ssm_state_indices``: ``[N]``, or vLLM's
          speculative ``[N, 1 + S]`` table with ``num_accepted_tokens [N]``, whose column 0 is
          the row's conv slot (as vLLM passes ``spec_state_indices[:, 0]`` to its conv).
        - ``conv_weights [D, W]`` (or ``[D, 1, W]``), ``conv_bias [D]`` or None; ``activation``
          the conv's, "silu" (or "swish") or None; ``norm_weight [V]``, ``norm_eps`` and
          ``norm_activation`` the gated RMSNorm's.
        - SGLang's target verify: ``intermediate_states_buffer [R, steps, HV, V, K]`` and
          ``intermediate_conv_window [R, steps, D, W - 1]`` (its deduplicated view too) receive
          the states and conv windows after every draft token at the rows
          ``intermediate_state_indices [N]``, usually with ``disable_state_update=True`` (then
          neither state is written). The token bound is then the buffer's steps. Beside an int8
          or fp8 ``ssm_state`` (its scales ``state_scales [slots, HV, V]``) the buffer is in the
          pool's format, with ``intermediate_states_scales [R, steps, HV, V]``.
        - ``uniform_seqlen``: the engine's promise that sequence n starts at
          ``n * max_query_len`` (see gdn_decode's argument of that name).

        Returns the normed output, shaped as ``z``."""
        packed = query_start_loc is not None
        per_token = getattr(ssm_state_indices, "ndim", 1) == 2
        rows = query_start_loc.shape[0] - 1 if packed else getattr(mixed_qkv, "shape", (None,))[0]
        bound = "max_query_len"
        if packed and max_query_len is None and intermediate_states_buffer is not None:
            max_query_len = getattr(intermediate_states_buffer, "shape", (None, None))[1]
            bound = "intermediate_states_buffer.shape[1]"
        elif packed and max_query_len is None:
            max_query_len, bound = vllm_token_bound(ssm_state_indices, per_token, bound)
        output, _ = self._launch(
            {**_CORE_NAMES, "max_seqlen": bound},
            dict(
                mixed_qkv=mixed_qkv,
                a=a,
                b=b,
                A_log=A_log,
                dt_bias=dt_bias,
                scale=scale,
                use_qk_l2norm=use_qk_l2norm_in_kernel,
                initial_state=ssm_state,
                initial_state_indices=leading_rows(ssm_state_indices, rows),
                num_accepted_tokens=leading_rows(num_accepted_tokens, rows),
                null_slot=self.null_slot,
                cu_seqlens=query_start_loc,
                max_seqlen=max_query_len,
                uniform_seqlen=uniform_seqlen,
                state_scales=state_scales,
                output=out,
                z=z,
                norm_weight=norm_weight,
                norm_eps=norm_eps,
                norm_activation=norm_activation,
                conv_state=conv_state,
                conv_weight=conv_weights,
                conv_bias=conv_bias,
                conv_activation=_CONV_ACTIVATIONS.get(activation, activation),
                intermediate_states_buffer=intermediate_states_buffer,
                intermediate_state_indices=leading_rows(intermediate_state_indices, rows),
                intermediate_conv_windows=intermediate_conv_window,
                intermediate_states_scales=intermediate_states_scales,
                disable_state_update=disable_state_update,
            ),
        )
        return output

    def _launch(self, names: Mapping[str, str], arguments: dict):
        """``gdn_decode(**arguments)``; a TypeError or ValueError whose message starts with a
        gdn_decode argument in ``names`` is raised again under the engine's name for it."""
        try:
            return self.gdn_decode(**arguments)
        except (TypeError, ValueError) as error:
            renamed = _renamed(error, names)
            if renamed is None:
                raise
            raise renamed from error


#: gdn_decode's argument names -> the packed decode ops', for the messages of gdn_decode's checks
_PACKED_NAMES = {
    "q": "mixed_qkv",
    "k": "mixed_qkv",
    "v": "mixed_qkv",
    "q/v": "mixed_qkv",
    "initial_state_indices": "ssm_state_indices",
    "output": "out",
    "use_qk_l2norm": "use_qk_l2norm_in_kernel",
}


#: gdn_decode's argument names -> decode_core's
_CORE_NAMES = {
    **_PACKED_NAMES,
    "initial_state": "ssm_state",
    "cu_seqlens": "query_start_loc",
    "conv_weight": "conv_weights",
    "conv_activation": "activation",
    "intermediate_conv_windows": "intermediate_conv_window",
}


#: the engines' conv activation names -> gdn_decode's ``conv_activation`` (others pass through
#: to its check)
_CONV_ACTIVATIONS = {"silu": "silu", "swish": "silu", None: "identity"}


def vllm_token_bound(ssm_state_indices, per_token: bool, given_name: str) -> tuple[int, str]:
    """The token bound of a packed call whose caller gave none, from shapes only, and the name
    an error about it should use: the per-token table's width (1 + S), else 1 (decode); with
    ``[N]`` indices the name stays ``given_name`` (the engine's argument)."""
    if per_token:
        return ssm_state_indices.shape[1], "ssm_state_indices.shape[1]"
    return 1, given_name


def _renamed(error: Exception, names: Mapping[str, str]) -> Exception | None:
    name, colon, rest = str(error).partition(":")
    if not colon or names.get(name, name) == name:
        return None
    kind = TypeError if isinstance(error, TypeError) else ValueError
    return kind(f"{names[name]} (gdn_decode's {name}):{rest}")


def leading_rows(indices, rows: int):
    """The first ``rows`` entries of a per-sequence tensor (a view): both engines pass index
    tensors sized for their padded CUDA-graph batch and read only the rows of the call's
    sequences. Anything that is not a tensor is left for gdn_decode's checks to name."""
    if indices is None or not hasattr(indices, "dim") or indices.dim() == 0:
        return indices
    return indices[:rows]


def token_gates(gate, q, packed: bool):
    """``a`` or ``b`` given as ``[tokens, HV]`` (the engines' token-major form), as the view
    gdn_decode takes beside a 4-D q: ``[1, total_tokens, HV]`` when packed, ``[B, T, HV]`` when
    dense (from ``[B * T, HV]``). Other shapes are left for its checks to name."""
    if gate is None or not hasattr(gate, "dim") or gate.dim() != 2:
        return gate
    if packed:
        return gate.unsqueeze(0)
    batch, tokens = q.shape[0], q.shape[1]
    if gate.size(0) != batch * tokens:
        return gate
    return gate.unflatten(0, (batch, tokens))


def __getattr__(name: str):
    # The adapters import this module for the base class, so they are loaded on first use.
    if name == "VllmGdn":
        from .vllm import VllmGdn

        return VllmGdn
    if name == "SglangGdn":
        from .sglang import SglangGdn

        return SglangGdn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
