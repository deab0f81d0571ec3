"""Trace-time helpers of the gated RMSNorm epilogue (docs/design.md, "The fused decode core").

The norm of a token's output needs the sum of squares over all V rows of its value head, and a
CTA holds TILE_V of them. The head's V // TILE_V CTAs form one thread-block cluster (the grid's
x dimension is exactly that, so a cluster is one (value head, row)); each CTA adds its rows'
squares (warp butterflies, then one shared-memory slot per warp) and reads every peer's CTA sum
through distributed shared memory. With TILE_V == V the cluster is one CTA and no cluster
barrier is spent. Every thread of every CTA adds the same numbers in the same order, so the
head's CTAs agree bit for bit on the scale of each token.

``activate`` is the gate's activation: ``silu(z) = z * sigmoid(z)``, or ``sigmoid(z)``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import AddressSpace, Float32, Int32
from cutlass._mlir.dialects import llvm, nvvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .lanes import WARP, butterfly_offsets

#: XOR offsets of a butterfly over a whole warp
WARP_BUTTERFLY = butterfly_offsets(WARP)


@cute.jit
def sum_over_head(
    squares: cute.Tensor,
    total: cute.Tensor,
    tokens: cutlass.Constexpr[int],
    threads: cutlass.Constexpr[int],
    cluster: cutlass.Constexpr[int],
):
    """``squares``: a register tensor of ``tokens`` per-thread partial sums (zero on threads
    that hold no output of their own). Fills ``total`` (as many) with the head's sums, the same
    in every thread of the cluster. Every thread of the CTA must call it."""
    for offset in WARP_BUTTERFLY:
        for t in cutlass.range_constexpr(tokens):
            squares[t] += cute.arch.shuffle_sync_bfly(squares[t], offset=offset)
    smem = cutlass.memory.SmemAllocator()
    warp_sums = smem.allocate_tensor(
        Float32, cute.make_layout((tokens, threads // WARP), stride=(threads // WARP, 1)), 16
    )
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    if cute.arch.lane_idx() == 0:
        for t in cutlass.range_constexpr(tokens):
            warp_sums[t, warp] = squares[t]
    cute.arch.barrier()
    for t in cutlass.range_constexpr(tokens):
        total[t] = warp_sums[t, 0]
        for w in cutlass.range_constexpr(1, threads // WARP):
            total[t] += warp_sums[t, w]
    if cutlass.const_expr(cluster > 1):
        cta_sums = smem.allocate_tensor(Float32, cute.make_layout((tokens,)), 16)
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            for t in cutlass.range_constexpr(tokens):
                cta_sums[t] = total[t]
        # Arrive releases this CTA's sums, wait acquires every peer's.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        for t in cutlass.range_constexpr(tokens):
            total[t] = Float32(0.0)
        for rank in cutlass.range_constexpr(cluster):
            for t in cutlass.range_constexpr(tokens):
                total[t] += load_from_peer((cta_sums.iterator + t), rank)
        # A CTA's shared memory must outlive its peers' reads of it.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()


@dsl_user_op
def load_from_peer(smem_ptr, rank, *, loc=None, ip=None) -> Float32:
    """The fp32 at ``smem_ptr`` (this CTA's shared memory) in the shared memory of the cluster's
    CTA ``rank``: ld.shared::cluster through the address mapa gives (CuTe's tensors do not load
    from distributed shared memory)."""
    remote = nvvm.mapa(
        llvm.PointerType.get(AddressSpace.dsmem),
        smem_ptr.to_llvm_ptr(loc=loc, ip=ip),
        Int32(rank).ir_value(loc=loc, ip=ip),
        loc=loc,
        ip=ip,
    )
    return Float32(llvm.load(T.f32(), remote, loc=loc, ip=ip))


def activate(z, activation: str):
    """The gate's activation of one fp32 value (``activation`` is known at trace time)."""
    sigmoid = 1.0 / (1.0 + cute.math.exp(-z))
    return z * sigmoid if activation == "silu" else sigmoid
