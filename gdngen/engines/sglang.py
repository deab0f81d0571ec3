"""SGLang's GDN decode entry points served by a gdngen target (docs/engines.md, "SGLang").

SGLang 0.5.23's Triton GDN kernel backend (``sglang/srt/layers/attention/linear/kernels/
gdn_triton.py``) calls two ops; :class:`SglangGdn` has a method of the same name, parameters and
return value for each:

- ``fused_recurrent_gated_delta_rule_packed_decode`` (``sglang/kernels/ops/attention/fla/
  fused_recurrent.py``): decode, one token per request, from the post-convolution ``mixed_qkv``
  rows; gdn_decode's ``mixed_qkv`` form.
- ``fused_sigmoid_gating_delta_rule_update`` (``sglang/kernels/ops/attention/linear/
  fused_sigmoid_gating_recurrent.py``): decode, and target verify, which stores the state after
  every draft token in a pool-row buffer ``[R, cache_steps, HV, V, K]`` at the rows
  ``intermediate_state_indices`` names and leaves the pool alone; gdn_decode's packed form
  (``cu_seqlens``) with cache rows.

SGLang's padding slot is -1 (``PAD_SLOT_ID``, in CUDA-graph replay): gdn_decode's default
``null_slot=-1``. Slot 0 is a real slot to gdngen, as to SGLang (its eager padding sink).
"""

from __future__ import annotations

from . import EngineAdapter, leading_rows, token_gates

__all__ = ["SglangGdn"]

#: gdn_decode's argument names -> SGLang's, for the messages of gdn_decode's checks
_UPDATE_NAMES = {
    "initial_state": "initial_state_source",
    "use_qk_l2norm": "use_qk_l2norm_in_kernel",
}


class SglangGdn(EngineAdapter):
    """SGLang's GDN decode ops on a gdngen target: ``SglangGdn(generated.h200.gdn_decode)``."""

    null_slot = -1  # PAD_SLOT_ID

    def fused_sigmoid_gating_delta_rule_update(
        self,
        A_log,
        a,
        dt_bias,
        softplus_beta,
        softplus_threshold,
        q,
        k,
        v,
        b,
        initial_state_source,
        initial_state_indices,
        scale=None,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
        is_kda=False,
        lower_bound=None,
        disable_state_update=False,
        intermediate_states_buffer=None,
        intermediate_state_indices=None,
        cache_steps=None,
        retrieve_parent_token=None,
        cache_ring=False,
        replayssm_rawv=None,
        replayssm_rawk=None,
        replayssm_g=None,
        replayssm_beta=None,
        match_cutedsl_decode=False,
        *,
        max_seqlen=None,
        uniform_seqlen=False,
        state_scales=None,
        intermediate_states_scales=None,
    ):
        """Decode and target verify through the pool ``initial_state_source [slots, HV, V, K]``
        at ``initial_state_indices [N]``.

        With ``cu_seqlens [N + 1]``: q, k ``[1, total, H, K]`` (strided token rows are fine),
        v ``[1, total, HV, V]``, a, b ``[total, HV]``. Decode has one token per sequence.
        Target verify passes ``intermediate_states_buffer [R, cache_steps, HV, V, K]``,
        ``intermediate_state_indices [N]`` (the buffer row of each sequence's per-token states)
        and ``cache_steps`` (the draft tokens per sequence, the compile-time T), usually with
        ``disable_state_update=True``. The token bound is ``cache_steps`` when given, else the
        buffer's steps with a buffer, else 1; ``max_seqlen`` (an addition, keyword only)
        overrides it; ``uniform_seqlen`` (keyword only) promises that sequence n starts at
        ``n * max_seqlen``, as in target verify with a fixed draft length, so the kernel places
        the tokens without waiting for ``cu_seqlens``. An int8 or fp8 pool takes its rows'
        scales ``state_scales [slots, HV, V]``, and its verify buffer (in the pool's format)
        theirs, ``intermediate_states_scales [R, cache_steps, HV, V]`` (keyword only, additions;
        docs/engines.md, "A quantized state"). Rows past N of the index tensors are not
        read (SGLang sizes them for its padded batch). Without ``cu_seqlens`` the call is dense: q ``[B, T, H, K]``, a, b
        ``[B * T, HV]`` or ``[B, T, HV]``. Returns the output, shaped as v, as SGLang's op does.
        """
        for name, value, served in (
            ("softplus_beta", softplus_beta, 1.0),
            ("softplus_threshold", softplus_threshold, 20.0),
        ):
            if value != served:
                raise ValueError(
                    f"{name}: gdngen's kernels compute softplus with beta 1.0 and threshold 20.0; "
                    f"got {name}={value!r}"
                )
        if retrieve_parent_token is not None:
            raise ValueError(
                "retrieve_parent_token: tree drafts (each token continuing from its parent's "
                "cached state) are not supported; gdngen verifies a linear chain of draft tokens"
            )
        for name, refused, value, what in (
            ("is_kda", is_kda, is_kda, "KDA's per-channel gate"),
            ("lower_bound", lower_bound is not None, lower_bound, "the KDA lower-bounded gate"),
            ("cache_ring", cache_ring, cache_ring, "the ReplaySSM ring write"),
            (
                "match_cutedsl_decode",
                match_cutedsl_decode,
                match_cutedsl_decode,
                "the KDA CuTe DSL parity mode",
            ),
        ):
            if refused:
                raise ValueError(f"{name}: {what} is not served by gdngen; got {name}={value!r}")
        if initial_state_source is None or initial_state_indices is None:
            name = (
                "initial_state_source" if initial_state_source is None else "initial_state_indices"
            )
            raise ValueError(
                f"{name}: gdngen needs the state pool and its slot indices; got None (a call "
                "from a zero state with no state kept is not served)"
            )
        packed = cu_seqlens is not None
        rows = cu_seqlens.shape[0] - 1 if packed else q.shape[0]
        bound = "max_seqlen"
        if packed and max_seqlen is None:
            if cache_steps is not None:
                max_seqlen, bound = cache_steps, "cache_steps"
            elif intermediate_states_buffer is not None:
                max_seqlen = intermediate_states_buffer.shape[1]
                bound = "intermediate_states_buffer.shape[1]"
            else:
                max_seqlen = 1  # decode: one token per sequence
        output, _ = self._launch(
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
                initial_state=initial_state_source,
                initial_state_indices=leading_rows(initial_state_indices, rows),
                intermediate_states_buffer=intermediate_states_buffer,
                intermediate_state_indices=leading_rows(intermediate_state_indices, rows),
                disable_state_update=disable_state_update,
                null_slot=self.null_slot,
                cu_seqlens=cu_seqlens,
                max_seqlen=max_seqlen,
                uniform_seqlen=uniform_seqlen,
                state_scales=state_scales,
                intermediate_states_scales=intermediate_states_scales,
            ),
        )
        return output
