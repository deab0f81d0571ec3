"""Device helpers of the gated RMSNorm epilogue (docs/design.md, "The gated RMSNorm epilogue").

The norm of a token's output needs the sum of squares over all V rows of its value head, and a
CTA holds TILE_V of them. The head's V // TILE_V CTAs form one thread-block cluster (the grid's
x dimension is exactly that, so a cluster is one (value head, row)).

``start_gated_norm`` sets the epilogue up before the token loop (:class:`HeadNorm`). Each
token's outputs wait in shared memory, folded with weight and gate as they come at T = 1 (at
T > 1 the fold comes at the end, with z staged by ``stage_rows``), and the kernel adds its rows'
squares per token. So only the inverse RMS, one scalar per token, waits for the head. After the
token loop:

1. ``publish_head_squares``: each warp's sums (a butterfly) go from its lane 0 into slot
   (token, rank, warp) of every CTA of the cluster (stores into distributed shared memory),
   then the CTA arrives on the cluster barrier with release semantics;
2. the kernel stores its state: the peers' sums travel meanwhile;
3. ``gather_head_squares``: the wait acquires every peer's stores, and each thread adds its own
   CTA's slots in one fixed order, so every CTA of the head gets the same scale bit for bit.

Nobody reads another CTA's shared memory, so no second barrier keeps a CTA alive for its peers.
A write into a peer needs the peer running: ``announce_start`` arrives (relaxed) at the kernel's
start and ``publish_head_squares`` waits on that phase first, long after every peer arrived.
With TILE_V == V the cluster is one CTA and a CTA barrier takes the cluster barrier's place.

``activate`` is the gate's activation: ``silu(z) = z * sigmoid(z)``, or ``sigmoid(z)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import AddressSpace, Float32, Int32
from cutlass._mlir.dialects import llvm, nvvm
from cutlass.cutlass_dsl import dsl_user_op

from .lanes import WARP, butterfly_offsets

#: XOR offsets of a butterfly over a whole warp
WARP_BUTTERFLY = butterfly_offsets(WARP)


def head_square_slots(tokens: int, threads: int, cluster: int) -> cute.Tensor:
    """This CTA's shared-memory slots of the head's per-warp sums: (token, rank, warp), the
    (rank, warp) mode contiguous so that a token's sums are read in one sweep."""
    warps = threads // WARP
    layout = cute.make_layout((tokens, cluster, warps), stride=(cluster * warps, warps, 1))
    return cutlass.memory.SmemAllocator().allocate_tensor(Float32, layout, 16)


#: widths of one cp.async copy, in bits
ASYNC_COPY_BITS = (32, 64, 128)


@cute.jit
def stage_rows(src: cute.Tensor, dst: cute.Tensor):
    """Start copying ``src`` (a lane's contiguous global elements) into ``dst`` (shared memory,
    same element type): cp.async in the widest chunks that divide the row (cute.arch.
    cp_async_commit_group / cp_async_wait_group complete it). Rows under 32 bits, which cp.async
    cannot move, are copied through registers."""
    row_bits = cute.size(src) * src.element_type.width
    if cutlass.const_expr(row_bits < ASYNC_COPY_BITS[0]):
        dst.store(src.load())
    else:
        bits = max(b for b in ASYNC_COPY_BITS if row_bits % b == 0)
        chunk = bits // src.element_type.width
        atom = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(), src.element_type, num_bits_per_copy=bits
        )
        src_chunks = cute.zipped_divide(src, (chunk,))
        dst_chunks = cute.zipped_divide(dst, (chunk,))
        for c in cutlass.range_constexpr(cute.size(src) // chunk):
            cute.copy(atom, src_chunks[None, c], dst_chunks[None, c])


@cute.jit
def announce_start(cluster: cutlass.Constexpr[int]):
    """Arrive (relaxed) on the cluster barrier: this CTA runs, so peers may write into its
    shared memory once the phase completes. Every thread calls it, before any other arrive."""
    if cutlass.const_expr(cluster > 1):
        cute.arch.cluster_arrive_relaxed()


@dataclass(frozen=True)
class HeadNorm:
    """What a CTA keeps of the epilogue between the token loop's parts (``start_gated_norm``)."""

    #: this CTA's slots of the head's per-warp sums (``head_square_slots``)
    slots: cute.Tensor
    #: this thread's sum of squares per token
    squares: cute.Tensor
    #: the norm weight of this lane's rows
    weight_rows: cute.Tensor
    #: each token's outputs of the CTA's rows, in shared memory until the inverse RMS is known
    gated: cute.Tensor
    #: at T > 1, every token's z of the CTA's rows, copied into shared memory (else None)
    z_staged: cute.Tensor | None


def load_weight_rows(norm_weight: cute.Tensor, row_block, ilp: int) -> cute.Tensor:
    """The norm weight of a lane's ``ilp`` rows (``row_block`` of the head), as fp32."""
    weight_rows = cute.make_rmem_tensor((ilp,), Float32)
    weight_rows.store(cute.zipped_divide(norm_weight, (ilp,))[None, row_block].load().to(Float32))
    return weight_rows


def start_gated_norm(
    z: cute.Tensor,
    norm_weight: cute.Tensor,
    seq,
    token_at,
    hv,
    row_block,
    group,
    tokens: int,
    tile_v: int,
    ilp: int,
    threads: int,
    cluster: int,
    stages_z: Callable,
    weight_rows=None,
) -> HeadNorm:
    """The epilogue's start, before the token loop: announce the CTA to its ``cluster`` (the
    head's CTAs), take the shared memory, load the weight of the lane's ``ilp`` rows
    (``row_block`` of the head, ``group`` of the CTA), unless ``weight_rows`` holds it already
    (a PDL kernel loads it before its wait: gdngen.device.pdl), and, at T > 1, start copying every token's
    z (rows ``seq``, ``token_at``, value head ``hv``) into shared memory on the lanes where
    ``stages_z()`` holds (``_stage_z``). Each token's outputs wait in shared memory (``gated``;
    in registers they would be T * ilp a thread) and their squares are added as they come
    (``squares``); the inverse RMS, a scalar per token, waits for the head's other rows. (A plain
    function: the record a ``cute.jit`` one returned would come back with its numbers staged.)"""
    announce_start(cluster)
    slots = head_square_slots(tokens, threads, cluster)
    squares = cute.make_rmem_tensor((tokens,), Float32)
    if weight_rows is None:
        weight_rows = load_weight_rows(norm_weight, row_block, ilp)
    staging = cutlass.memory.SmemAllocator()
    gated = staging.allocate_tensor(
        Float32, cute.make_layout((tokens, tile_v), stride=(tile_v, 1)), 16
    )
    z_staged = None
    if tokens > 1:
        # Every token's z, copied in by cp.async now. (Loaded in the token loop beside the other
        # inputs, T tokens of z cost more registers than their size: on sm_90a 182 against 128
        # for kl_bf16_tv128_ilp8 at T = 4.) At T = 1, z comes with the token's other inputs.
        z_staged = staging.allocate_tensor(
            z.element_type, cute.make_layout((tokens, tile_v), stride=(tile_v, 1)), 16
        )
        _stage_z(z, z_staged, seq, token_at, hv, row_block, group, tokens, ilp, stages_z)
    return HeadNorm(slots, squares, weight_rows, gated, z_staged)


@cute.jit
def _stage_z(
    z: cute.Tensor,
    z_staged: cute.Tensor,
    seq,
    token_at,
    hv,
    row_block,
    group,
    tokens: cutlass.Constexpr[int],
    ilp: cutlass.Constexpr[int],
    stages_z: Callable,
):
    """Start the copy of every token's z into ``z_staged`` on the lanes where ``stages_z()``
    holds. (``stages_z`` is called here, where the copy is issued: a condition computed before
    moves ahead in the PTX.)"""
    if stages_z():
        for t in cutlass.range_constexpr(tokens):
            stage_rows(
                cute.zipped_divide(z[seq, token_at[t], hv, None], (ilp,))[None, row_block],
                cute.zipped_divide(z_staged[t, None], (ilp,))[None, group],
            )
        cute.arch.cp_async_commit_group()


@cute.jit
def publish_head_squares(
    squares: cute.Tensor,
    slots: cute.Tensor,
    tokens: cutlass.Constexpr[int],
    cluster: cutlass.Constexpr[int],
):
    """``squares``: ``tokens`` per-thread partial sums (zero on threads that hold no output of
    their own). Writes each warp's sums into ``slots`` of every CTA of the cluster and arrives.
    Every thread of the CTA calls it; ``gather_head_squares`` completes it."""
    for offset in WARP_BUTTERFLY:
        for t in cutlass.range_constexpr(tokens):
            squares[t] += cute.arch.shuffle_sync_bfly(squares[t], offset=offset)
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    if cutlass.const_expr(cluster > 1):
        # The start phase: every peer runs (it arrived at its start, long ago).
        cute.arch.cluster_wait()
        if cute.arch.lane_idx() == 0:
            rank = cute.arch.block_idx_in_cluster()
            for t in cutlass.range_constexpr(tokens):
                own_slot = slots.iterator + cute.crd2idx((t, rank, warp), slots.layout)
                for peer in cutlass.range_constexpr(cluster):
                    store_to_peer(own_slot, peer, squares[t])
        # Release: the stores above reach every peer before its wait returns.
        cute.arch.cluster_arrive()
    else:
        if cute.arch.lane_idx() == 0:
            for t in cutlass.range_constexpr(tokens):
                slots[t, 0, warp] = squares[t]


@cute.jit
def gather_head_squares(
    slots: cute.Tensor,
    total: cute.Tensor,
    tokens: cutlass.Constexpr[int],
    threads: cutlass.Constexpr[int],
    cluster: cutlass.Constexpr[int],
):
    """Fills ``total`` (``tokens`` entries) with the head's sums of squares, the same in every
    thread of the cluster: waits for every CTA's ``publish_head_squares``, then adds the slots."""
    if cutlass.const_expr(cluster > 1):
        cute.arch.cluster_wait()
    else:
        cute.arch.barrier()
    for t in cutlass.range_constexpr(tokens):
        total[t] = Float32(0.0)
        for rank in cutlass.range_constexpr(cluster):
            for w in cutlass.range_constexpr(threads // WARP):
                total[t] += slots[t, rank, w]


@dsl_user_op
def store_to_peer(smem_ptr, rank, value, *, loc=None, ip=None) -> None:
    """Store the fp32 ``value`` at ``smem_ptr`` (an address of this CTA's shared memory) in the
    shared memory of the cluster's CTA ``rank``: st.shared::cluster through the address mapa
    gives (CuTe's tensors do not store into distributed shared memory)."""
    remote = nvvm.mapa(
        llvm.PointerType.get(AddressSpace.dsmem),
        smem_ptr.to_llvm_ptr(loc=loc, ip=ip),
        Int32(rank).ir_value(loc=loc, ip=ip),
        loc=loc,
        ip=ip,
    )
    llvm.store(Float32(value).ir_value(loc=loc, ip=ip), remote, loc=loc, ip=ip)


def activate(z, activation: str):
    """The gate's activation of one fp32 value (``activation`` is known at trace time). The
    reciprocal is the approximate one (one MUFU instruction, within 1 ulp of fp32, far under the
    bf16/fp16 output's rounding): the IEEE-rounded one costs ten-odd instructions with a slow
    path, and T * ILP of them, unrolled, pushed a T = 8 kernel out of the instruction cache (on an
    H100, 2.3x slower). exp(-z) = inf gives a gate of 0."""
    sigmoid = cute.arch.rcp_approx(1.0 + cute.math.exp(-z))
    return z * sigmoid if activation == "silu" else sigmoid
