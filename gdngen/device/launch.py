"""The host-side ``launch`` every decode kernel module shares.

A kernel body (``generated/<target>/bodies/``) makes its ``decode_kernel`` (the device code) for
one variant's numbers, as a :class:`DeviceCode`; the variant's module builds its ``launch`` from
it here: a ``cute.jit`` function taking the kernel's arguments plus the stream, which checks at
trace time that the call's head dims are the ones the variant serves and launches one CTA per
``tile_v`` rows of each (value head, batch row); with the gated RMSNorm epilogue (``z`` given),
the V // tile_v CTAs of a head form one thread-block cluster (gdngen.device.norm). The runtime
compiles ``launch`` (gdngen.runtime.compile).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Constexpr, Float32, Int32

from gdngen.terms import (
    CONV_ACTIVATIONS,
    NORM_ACTIVATIONS,
    PORTABLE_CLUSTER,
    require_activation,
)

from .rows import kernel_rows


@dataclass(frozen=True)
class DeviceCode:
    """A kernel body's device code for one variant's numbers, and what the host side needs of
    it: the rows a CTA owns, its threads, the K it serves, and whether it has the stepwise solve
    (and so the gated RMSNorm epilogue and the conv1d prologue)."""

    decode_kernel: object
    tile_v: int
    threads: int
    head_k_dim: int
    gated_norm: bool


def decode_launcher(code: DeviceCode, *, name: str, min_ctas_per_sm: int = 0):
    """``launch(<the kernel's arguments>, launch_pdl, stream)`` for ``code``, named ``name``:
    the arguments are gdngen.runtime.kernel_args's KERNEL_ARGS, then its LAUNCH_ONLY_ARGS, in
    that order (CuTe DSL reads the parameters from this source, so they are spelled here;
    tests/test_kernel_args.py holds them to it).
    Without ``code.gated_norm`` (the stepwise solve), ``z`` and ``norm_weight`` must be None, and
    so must ``conv_*`` (``conv_windows`` is None without the verify cache as well); with
    ``min_ctas_per_sm``, launch bounds that fit that many CTAs on an SM. A packed call
    (``cu_seqlens``) has one kernel row per sequence, a dense one per batch row."""
    decode_kernel, tile_v, threads = code.decode_kernel, code.tile_v, code.threads
    head_k_dim, gated_norm = code.head_k_dim, code.gated_norm

    @cute.jit
    def launch(
        q: cute.Tensor,
        k: cute.Tensor,
        v: cute.Tensor,
        a: cute.Tensor,
        b: cute.Tensor,
        A_log: cute.Tensor,
        dt_bias: cute.Tensor,
        state: cute.Tensor,
        read_slots,
        write_slots,
        num_accepted,
        cu_seqlens,
        cache_rows,
        accepted_steps,
        out: cute.Tensor,
        cache,
        scale: Float32,
        T: Constexpr[int],
        use_qk_l2norm: Constexpr[bool],
        write_final_state: Constexpr[bool],
        null_slot: Constexpr[int],
        per_token_slots: Constexpr[bool],
        uniform_rows: Constexpr[bool],
        exact_slot_table: Constexpr[bool],
        recovery_steps: Constexpr[int],
        z,
        norm_weight,
        norm_eps: Float32,
        norm_activation: Constexpr[str],
        conv_state,
        conv_weight,
        conv_bias,
        conv_arrivals,
        conv_windows,
        conv_activation: Constexpr[str],
        pdl: Constexpr[bool],
        state_scales,
        cache_scales,
        launch_pdl: Int32,
        stream,
    ):
        num_v_heads = v.shape[2]
        head_v_dim = v.shape[3]
        if cutlass.const_expr(q.shape[3] != head_k_dim or head_v_dim % tile_v != 0):
            raise ValueError(
                f"{name} serves K={head_k_dim} and V divisible by {tile_v}; "
                f"got K={q.shape[3]}, V={head_v_dim}"
            )
        cluster = 1
        if cutlass.const_expr(z is not None):
            cluster = head_v_dim // tile_v
            if cutlass.const_expr(not gated_norm or cluster > PORTABLE_CLUSTER):
                raise ValueError(
                    f"{name} has no gated RMSNorm epilogue for V={head_v_dim}: the epilogue "
                    f"needs the stepwise solve and at most {PORTABLE_CLUSTER} CTAs a head"
                )
            require_activation("norm_activation", norm_activation, NORM_ACTIVATIONS)
        if cutlass.const_expr(conv_state is not None):
            if cutlass.const_expr(not gated_norm):
                raise ValueError(
                    f"{name} has no conv1d prologue: the prologue needs the stepwise solve"
                )
            require_activation("conv_activation", conv_activation, CONV_ACTIVATIONS)
        kernel = decode_kernel(
            q, k, v, a, b, A_log, dt_bias, state, read_slots, write_slots, num_accepted, cu_seqlens,
            cache_rows, accepted_steps, out, cache, scale, T, use_qk_l2norm, write_final_state,
            null_slot, per_token_slots, uniform_rows, exact_slot_table, recovery_steps, z,
            norm_weight, norm_eps,
            norm_activation, conv_state, conv_weight, conv_bias, conv_arrivals, conv_windows,
            conv_activation, pdl, state_scales, cache_scales,
        )  # fmt: skip
        grid = (head_v_dim // tile_v, num_v_heads, kernel_rows(q.shape[0], cu_seqlens))
        # The PDL attribute is the call's (gdngen.runtime.pdl); a kernel without the wait never
        # takes it.
        overlap = launch_pdl if cutlass.const_expr(pdl) else False
        if cutlass.const_expr(min_ctas_per_sm > 0):
            # The driver's default carveout; naming it keeps the compile free of device queries.
            kernel.launch(
                grid=grid,
                block=(threads, 1, 1),
                min_blocks_per_mp=min_ctas_per_sm,
                preferred_smem_carveout=-1,
                stream=stream,
                use_pdl=overlap,
            )
        elif cutlass.const_expr(cluster > 1):
            # One cluster per head: its CTAs' sums of squares meet in distributed shared memory.
            kernel.launch(
                grid=grid,
                block=(threads, 1, 1),
                cluster=(cluster, 1, 1),
                stream=stream,
                use_pdl=overlap,
            )
        else:
            kernel.launch(grid=grid, block=(threads, 1, 1), stream=stream, use_pdl=overlap)

    launch.set_name_prefix(name, remove_cutlass_symbol=True, keep_mangled_name=False)
    return launch
