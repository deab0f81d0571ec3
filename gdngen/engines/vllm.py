"""vLLM's GDN decode entry points served by a gdngen target (docs/engines.md, "vLLM").

vLLM 0.33.0's GDN layer (``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``) calls
two Triton ops from ``vllm/third_party/flash_linear_attention/ops/`` and, for speculative decode
on its default path (``VLLM_GDN_DECODE_KERNEL=cuda``), one fused CUDA op; :class:`VllmGdn` has a
method of the same name, parameters and return value for each:

- ``fused_recurrent_gated_delta_rule_packed_decode``: the all-decode batch (one token per
  request) straight from the post-convolution ``mixed_qkv`` rows; gdn_decode's ``mixed_qkv``
  form.
- ``fused_sigmoid_gating_delta_rule_update``: decode tokens of a mixed batch, and speculative
  verify with a per-token slot table ``[N, 1 + S]`` plus ``num_accepted_tokens``; gdn_decode's
  packed form (``cu_seqlens``) with per-token slots.
- ``fused_gdn_decode_post_conv_mtp`` (``torch.ops._C``, called through
  ``vllm._custom_ops``): speculative verify from the post-convolution ``mixed_qkv`` rows with the
  gated RMSNorm of the output fused; gdn_decode's packed ``mixed_qkv`` form with per-token slots
  and the gated RMSNorm epilogue.

vLLM's padding slot is its null block, 0 (``NULL_BLOCK_ID``): a row whose slot is <= 0 reads and
writes no state, so the adapter passes ``null_slot=0``.
"""

from __future__ import annotations

from . import EngineAdapter, leading_rows, token_gates, vllm_token_bound

__all__ = ["VllmGdn"]

#: gdn_decode's argument names -> vLLM's, for the messages of gdn_decode's checks
_UPDATE_NAMES = {
    "initial_state_indices": "ssm_state_indices",
    "use_qk_l2norm": "use_qk_l2norm_in_kernel",
}

#: gdn_decode's argument names -> fused_gdn_decode_post_conv_mtp's
_MTP_NAMES = {
    "q": "mixed_qkv",
    "k": "mixed_qkv",
    "v": "mixed_qkv",
    "q/v": "mixed_qkv",
    "initial_state": "state",
    "initial_state_indices": "state_indices",
    "max_seqlen": "state_indices.shape[1]",
    "output": "out",
    "z": "output_gate",
    "z/norm_weight": "output_gate/norm_weight",
    "norm_activation": "output_gate_activation",
}

#: the default ``scale`` of vLLM's wrapper of the op (``vllm._custom_ops``): Qwen3.5's K = 128
_MTP_DEFAULT_SCALE = 128**-0.5


class VllmGdn(EngineAdapter):
    """vLLM's GDN decode ops on a gdngen target: ``VllmGdn(generated.h200.gdn_decode)``."""

    null_slot = 0  # NULL_BLOCK_ID

    def fused_sigmoid_gating_delta_rule_update(
        self,
        A_log,
        a,
        b,
        dt_bias,
        q,
        k,
        v,
        beta=1.0,
        threshold=20.0,
        scale=None,
        initial_state=None,
        inplace_final_state=True,
        cu_seqlens=None,
        ssm_state_indices=None,
        num_accepted_tokens=None,
        use_qk_l2norm_in_kernel=False,
        is_kda=False,
        *,
        max_seqlen=None,
        uniform_seqlen=False,
        state_scales=None,
    ):
        """Decode and speculative verify through the pool ``initial_state [slots, HV, V, K]``.

        With ``cu_seqlens [N + 1]``: q, k ``[1, total, H, K]``, v ``[1, total, HV, V]``, a, b
        ``[total, HV]``. ``ssm_state_indices`` is either

        - ``[N]``: decode, one token per sequence (vLLM's kernel reads and writes slot ``[n]``;
          it has no meaning for longer sequences, so gdn_decode is compiled for one token); or
        - ``[N, 1 + S]`` with ``num_accepted_tokens [N]``: the state is read from column
          ``num_accepted_tokens - 1`` and the state after token t written to column t (up to
          1 + S tokens per sequence, the compile-time T).

        Rows past N of the index tensors are not read (vLLM sizes them for its padded batch).
        Without ``cu_seqlens`` the call is dense: q ``[B, T, H, K]``, a, b ``[B * T, HV]`` or
        ``[B, T, HV]``. ``max_seqlen`` (an addition, keyword only) overrides the token bound
        taken from the index shape. ``uniform_seqlen`` (an addition, keyword only): pass True
        only where the engine knows that sequence n starts at ``n * max_seqlen`` (every live
        sequence has ``max_seqlen`` tokens, as with a fixed number of draft tokens); the
        kernel then places the tokens without waiting for ``cu_seqlens`` (docs/engines.md).
        Returns ``(output, initial_state)``, the output shaped as v.
        """
        for name, value, served in (
            ("beta", beta, 1.0),
            ("threshold", threshold, 20.0),
        ):
            if value != served:
                raise ValueError(
                    f"{name}: gdngen's kernels compute softplus with beta 1.0 and threshold 20.0; "
                    f"got {name}={value!r}"
                )
        if inplace_final_state is not True:
            raise ValueError(
                "inplace_final_state: gdngen writes the states into the pool in place, at "
                "ssm_state_indices; a separate per-token state tensor is not served; got "
                f"{inplace_final_state!r}"
            )
        if is_kda:
            raise ValueError(
                "is_kda: gdngen serves the Gated Delta Net gate (one decay per value head), not "
                "KDA's per-channel gate"
            )
        if initial_state is None:
            raise ValueError(
                "initial_state: gdngen needs the state pool [slots, HV, V, K]; got None"
            )
        if ssm_state_indices is None:
            raise ValueError(
                "ssm_state_indices: gdngen reads and writes the pool through the slot indices "
                "([N] or [N, 1 + S]); got None"
            )
        per_token = ssm_state_indices.dim() == 2
        packed = cu_seqlens is not None
        bound = "max_seqlen"
        if packed:
            if q.dim() != 4 or q.shape[0] != 1:
                raise ValueError(
                    "q: with cu_seqlens, q is [1, total_tokens, H, K] (the sequences flattened); "
                    f"got shape {list(q.shape)}"
                )
            rows = cu_seqlens.shape[0] - 1
            if max_seqlen is None:
                max_seqlen, bound = vllm_token_bound(ssm_state_indices, per_token, bound)
        else:
            rows = q.shape[0]
            if not per_token and q.shape[1] > 1:
                raise ValueError(
                    f"ssm_state_indices: [B] indices serve one token per request; q has "
                    f"T={q.shape[1]} (pass a [B, 1 + S] per-token table for multi-token verify)"
                )
        return self._launch(
            {**_UPDATE_NAMES, "max_seqlen": bound},
            dict(
                q=q,
                k=k,
                v=v,
                A_log=A_log,
                a=token_gates(a, q, packed),
                dt_bias=dt_bias,
                b=token_gates(b, q, packed),
                scale=scale,
                use_qk_l2norm=use_qk_l2norm_in_kernel,
                initial_state=initial_state,
                initial_state_indices=leading_rows(ssm_state_indices, rows),
                num_accepted_tokens=leading_rows(num_accepted_tokens, rows),
                null_slot=self.null_slot,
                cu_seqlens=cu_seqlens,
                max_seqlen=max_seqlen,
                uniform_seqlen=uniform_seqlen,
                state_scales=state_scales,
            ),
        )

    def fused_gdn_decode_post_conv_mtp(
        self,
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        state_indices,
        cu_seqlens,
        num_accepted_tokens,
        state,
        output_gate,
        norm_weight,
        out=None,
        scale=_MTP_DEFAULT_SCALE,
        norm_eps=1e-5,
        output_gate_activation="silu",
        *,
        uniform_seqlen=False,
        state_scales=None,
    ):
        """Speculative verify with the gated RMSNorm fused, as vLLM's op
        ``torch.ops._C.fused_gdn_decode_post_conv_mtp`` (and its Triton port) does it, in one
        gdn_decode call.

        - ``mixed_qkv [tokens, 2*H*K + HV*V]``: the post-conv rows (rows may be strided); ``a``,
          ``b [tokens, HV]``; ``cu_seqlens [N + 1]`` packs N sequences into them (tokens past
          ``cu_seqlens[N]``, a graph's padding, are neither read nor written).
        - ``state [slots, HV, V, K]`` (updated in place) through ``state_indices [N, 1 + S]``:
          sequence n starts from the state at column ``num_accepted_tokens[n] - 1`` and stores
          the state after its token t at column t. A read slot <= 0 (vLLM's null block) makes
          the row padding: zero output, no state read or written; a column <= 0 stores nothing.
          1 + S (``state_indices.shape[1]``) is the compile-time T: at most the target's
          ``max_tokens``.
        - q and k are always L2-normalised (the op has no switch); ``scale`` scales q.
        - The output ``o`` of each value head is normed over its V elements and gated:
          ``o / sqrt(mean(o * o) + norm_eps) * norm_weight * act(output_gate)``, act
          ``output_gate_activation`` ("silu" or "sigmoid"); ``output_gate [tokens, HV, V]`` (a
          strided view of the projection serves), ``norm_weight [V]``.
        - ``out [tokens, HV, V]`` is written in place and returned; None: allocated, as vLLM's
          wrapper of the op does.
        - ``uniform_seqlen`` (an addition, keyword only): pass True only where the engine knows
          that sequence n starts at ``n * (1 + S)`` (see ``fused_sigmoid_gating_delta_rule_update``).

        Returns ``out``. vLLM's wrapper and the Triton port return it; the torch op itself
        returns nothing, and its callers ignore the value.
        """
        if cu_seqlens is None:
            raise ValueError(
                "cu_seqlens: vLLM's op packs the sequences' tokens by cu_seqlens [N + 1]; got None"
            )
        if num_accepted_tokens is None:
            raise ValueError(
                "num_accepted_tokens: vLLM's op reads each sequence's initial state from column "
                "num_accepted_tokens - 1 of state_indices; expected a tensor [N], got None"
            )
        columns = getattr(state_indices, "shape", ())
        if len(columns) != 2:
            raise ValueError(
                "state_indices: vLLM's op takes a per-token slot table [N, 1 + S] (column t "
                f"receives the state after token t); got {_shape_of(state_indices)}"
            )
        output, _ = self._launch(
            _MTP_NAMES,
            dict(
                mixed_qkv=mixed_qkv,
                a=a,
                b=b,
                A_log=A_log,
                dt_bias=dt_bias,
                scale=scale,
                use_qk_l2norm=True,
                initial_state=state,
                initial_state_indices=state_indices,
                num_accepted_tokens=num_accepted_tokens,
                null_slot=self.null_slot,
                cu_seqlens=cu_seqlens,
                max_seqlen=columns[1],
                uniform_seqlen=uniform_seqlen,
                state_scales=state_scales,
                output=out,
                z=output_gate,
                norm_weight=norm_weight,
                norm_eps=norm_eps,
                norm_activation=output_gate_activation,
            ),
        )
        return output


def _shape_of(value) -> str:
    shape = getattr(value, "shape", None)
    return type(value).__name__ if shape is None else f"shape {list(shape)}"
