"""vLLM's GDN decode entry points served by a gdngen target (docs/engines.md, "vLLM").

vLLM 0.33.0 calls two Triton ops from ``vllm/third_party/flash_linear_attention/ops/`` in
``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``; :class:`VllmGdn` has a method
of the same name, parameters and return value for each:

- ``fused_recurrent_gated_delta_rule_packed_decode``: the all-decode batch (one token per
  request) straight from the post-convolution ``mixed_qkv`` rows; gdn_decode's ``mixed_qkv``
  form.
- ``fused_sigmoid_gating_delta_rule_update``: decode tokens of a mixed batch, and speculative
  verify with a per-token slot table ``[N, 1 + S]`` plus ``num_accepted_tokens``; gdn_decode's
  packed form (``cu_seqlens``) with per-token slots.

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
            ),
        )
