"""The gated RMSNorm as a kernel of its own: the norm-split plan of a call with the epilogue
(docs/design.md, "The norm step apart").

A call with the gated RMSNorm normally normalises inside the decode kernel
(gdngen.device.norm), which reduces a head's squares over the CTAs of one cluster: only
variants with at most PORTABLE_CLUSTER CTAs a head can take it. Where the dispatch says so (a
rule's ``split_norm``), the decode kernel runs without the epilogue, storing the recurrence's
output o in the output's dtype, and this kernel then rewrites each of the call's output rows in
place: ``o / sqrt(mean(o^2) + eps) * weight * act(z)`` over the head's V values, as an engine's
own norm kernel does after its recurrence.

A thread holds ``E`` consecutive values of one head row (16 bytes of the output's dtype where V
allows), the ``lanes`` threads of a head a power of two of one warp, so the sum of squares is a
butterfly; a CTA holds :func:`heads_per_cta` heads of one row and loops over its tokens: grid
``(HV / heads_per_cta, rows)``.

Each output row is normalised exactly once (the norm is not idempotent): a token is rewritten
where the decode kernel stored it, the row's live tokens (gdngen.device.rows.row_tokens: a
packed sequence's tokens, at their positions; dense rows, all T). Rows the decode kernel filled
(padding: zeros, a bad index: NaN) stay zeros and NaN.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Constexpr, Float32, Int32, Int64

from gdngen.terms import NORM_ACTIVATIONS, require_activation

from .lanes import WARP, butterfly_offsets
from .norm import activate
from .pdl import wait_at_start, wait_for_producer
from .rows import kernel_rows, row_tokens

#: threads a CTA of the step aims at (whole heads)
CTA_THREADS = 128


def head_lanes(element_bytes: int, V: int) -> tuple[int, int]:
    """``(lanes, E)``: the threads of one head row (a power of two, at most a warp, dividing V)
    and the values each holds (16 bytes' worth where V allows)."""
    lanes = max(1, min(WARP, V * element_bytes // 16))
    while V % lanes or lanes & (lanes - 1):
        lanes -= 1
    return lanes, V // lanes


def heads_per_cta(HV: int, lanes: int) -> int:
    """The most heads a CTA of about CTA_THREADS holds, dividing HV: every warp's lanes all
    hold heads of the call, so each butterfly runs on whole heads."""
    most = max(1, CTA_THREADS // lanes)
    return max(d for d in range(1, min(HV, most) + 1) if HV % d == 0)


def norm_step_launcher(*, name: str):
    """``launch(out, z, norm_weight, cu_seqlens, norm_eps, <options>, launch_pdl, stream)``:
    the norm step's host side, named ``name`` (its parameters: gdngen.runtime.norm_step)."""

    @cute.kernel
    def norm_step_kernel(
        out: cute.Tensor,
        z: cute.Tensor,
        norm_weight: cute.Tensor,
        cu_seqlens,
        norm_eps: Float32,
        T: Constexpr[int],
        uniform_rows: Constexpr[bool],
        norm_activation: Constexpr[str],
        pdl: Constexpr[bool],
        E: Constexpr[int],
        lanes: Constexpr[int],
        per_cta: Constexpr[int],
    ):
        tidx, _, _ = cute.arch.thread_idx()
        block, n, _ = cute.arch.block_idx()
        wait_at_start(pdl)
        HV, V = out.shape[2], out.shape[3]
        hv = block * per_cta + tidx // lanes
        lane = tidx % lanes
        seq, token_at, token_live, _ = row_tokens(
            Int64(n), T, cu_seqlens, out.shape[1], uniform_rows
        )
        # The weight is the call's, not the producer's: loaded before the wait.
        weight = cute.make_rmem_tensor((E,), norm_weight.element_type)
        weight.store(cute.zipped_divide(norm_weight, (E,))[None, lane].load())
        wait_for_producer(pdl)
        # (no head of a warp is past HV: heads_per_cta divides it, so every butterfly is whole)
        # Every token's row and gate are loaded before any is normalised: one round trip for
        # the row's T tokens, not T.
        o = cute.make_rmem_tensor(cute.make_layout((T, E), stride=(E, 1)), Float32)
        g = cute.make_rmem_tensor(cute.make_layout((T, E), stride=(E, 1)), Float32)
        for t in cutlass.range_constexpr(T):
            if token_live[t]:
                at = token_at[t]
                row = cute.zipped_divide(out[seq, at, hv, None], (E,))[None, lane]
                gate = cute.zipped_divide(z[seq, at, hv, None], (E,))[None, lane]
                o[t, None].store(row.load().to(Float32))
                g[t, None].store(gate.load().to(Float32))
        for t in cutlass.range_constexpr(T):
            if token_live[t]:
                squares = Float32(0.0)
                for i in cutlass.range_constexpr(E):
                    squares += o[t, i] * o[t, i]
                for offset in butterfly_offsets(lanes):
                    squares += cute.arch.shuffle_sync_bfly(squares, offset=offset)
                scale = cute.math.rsqrt(squares / Float32(V) + norm_eps)
                normed = cute.make_rmem_tensor((E,), out.element_type)
                for i in cutlass.range_constexpr(E):
                    y = o[t, i] * scale * Float32(weight[i]) * activate(g[t, i], norm_activation)
                    normed[i] = y.to(out.element_type)
                row = cute.zipped_divide(out[seq, token_at[t], hv, None], (E,))[None, lane]
                row.store(normed.load())

    @cute.jit
    def launch(
        out: cute.Tensor,
        z: cute.Tensor,
        norm_weight: cute.Tensor,
        cu_seqlens,
        norm_eps: Float32,
        T: Constexpr[int],
        uniform_rows: Constexpr[bool],
        norm_activation: Constexpr[str],
        pdl: Constexpr[bool],
        launch_pdl: Int32,
        stream,
    ):
        require_activation("norm_activation", norm_activation, NORM_ACTIVATIONS)
        rows = kernel_rows(out.shape[0], cu_seqlens)
        HV, V = out.shape[2], out.shape[3]
        lanes, E = head_lanes(out.element_type.width // 8, V)
        per_cta = heads_per_cta(HV, lanes)
        norm_step_kernel(
            out, z, norm_weight, cu_seqlens, norm_eps, T, uniform_rows, norm_activation, pdl,
            E, lanes, per_cta,
        ).launch(
            grid=(HV // per_cta, rows, 1), block=(lanes * per_cta, 1, 1), stream=stream,
            use_pdl=launch_pdl if cutlass.const_expr(pdl) else False,
        )  # fmt: skip

    launch.set_name_prefix(name, remove_cutlass_symbol=True, keep_mangled_name=False)
    return launch
