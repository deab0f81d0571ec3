"""Compiling a kernel module for one set of compile-time inputs, and the key that names it.

Batch size, pool size, cache_steps and the outer strides of q/k/v/a/b/pool are run-time values
(one compiled kernel serves every batch); everything else is in :class:`CompileKey`. Compiling
needs no GPU: fake tensors stand in for the arguments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from gdngen.terms import SCALED_STATE_DTYPES, STATE_BYTES, kernel_serves_head_dims

from .arg_checks import VECTOR_ALIGN
from .checks import Call
from .kernel_args import KERNEL_ARGS, LAUNCH_ONLY_ARGS, KernelArg

ELEMENT_BYTES = {**STATE_BYTES, "int32": 4, "int64": 8}


@dataclass(frozen=True)
class CompileKey:
    """Every compile-time input of a kernel; two calls with equal keys share one binary."""

    variant: str
    arch: str
    tokens: int
    H: int
    HV: int
    K: int
    V: int
    io_dtype: str
    gate_dtype: str
    dt_bias_dtype: str
    state_dtype: str
    index_dtype: str | None
    separate_write_slots: bool
    cache: bool
    write_final_state: bool
    use_qk_l2norm: bool
    #: the engine call forms (docs/design.md, "Call forms"): a slot <= null_slot is padding;
    #: sequences packed along dim 1 with cu_seqlens of this dtype (T is then the most tokens a
    #: sequence has); a [N, 1 + S] per-token slot table, with num_accepted_tokens (with
    #: ``separate_write_slots`` as well: FlashInfer's [N] read slots and its per-token table
    #: ssm_state_indices [N, T]); cache rows named per row
    null_slot: int = -1
    cu_seqlens_dtype: str | None = None
    per_token_slots: bool = False
    num_accepted: bool = False
    cache_rows: bool = False
    #: shapes that fix where a row's tokens and slots are, without reading an index (docs/design.md,
    #: "Call forms"): a packed call of N sequences and N * T tokens has T tokens in every
    #: sequence, so sequence n's are at n * T; a per-token slot table of exactly T columns has
    #: the initial slot among the columns its tokens write
    uniform_rows: bool = False
    exact_slot_table: bool = False
    #: the gated RMSNorm epilogue (docs/design.md, "The fused decode core"): the gate's
    #: activation ("silu" or "sigmoid") and the norm weight's dtype; None without the epilogue
    norm_activation: str | None = None
    norm_weight_dtype: str | None = None
    #: the conv1d prologue (docs/design.md, "The conv1d prologue"): its width (taps), whether it
    #: has a bias, its activation ("silu" or "identity"); None without the prologue. Its weight,
    #: bias and state are in the io dtype. With the verify cache (``cache``) as well, the call
    #: caches every token's conv window too (``intermediate_conv_windows``)
    conv_width: int | None = None
    conv_bias: bool = False
    conv_activation: str | None = None
    #: programmatic dependent launch (docs/design.md, "Programmatic dependent launch"): the
    #: kernel loads what the grid before it cannot have written (state, weights, index
    #: tables), then waits for that grid, then reads its inputs
    pdl: bool = False
    #: the state pool's head and row strides are run-time values, each a whole number of 16-byte
    #: vectors (a view into a larger buffer: FlashInfer's strided pools); without it they are
    #: the dense ones, compiled in
    strided_state: bool = False
    #: state recovery (docs/design.md, "State recovery"): the dtype of ``accepted_steps``, each
    #: row's last accepted token [N] (None without it), and ``recovery_steps``, the leading
    #: tokens every row replays without output
    accepted_steps_dtype: str | None = None
    recovery_steps: int = 0
    #: the conv step's form of a channels-last conv state (gdngen.runtime.conv_step): its D
    #: stride is 1 and its other strides and base are 16-byte aligned, so the step moves it in
    #: 16-byte vectors; only conv step keys set it
    conv_channels_last: bool = False

    @classmethod
    def for_call(cls, variant: str, arch: str, call: Call, pdl: bool = False) -> "CompileKey":
        return cls(
            variant=variant,
            arch=arch,
            tokens=call.tokens,
            H=call.H,
            HV=call.HV,
            K=call.K,
            V=call.V,
            io_dtype=call.io_dtype,
            gate_dtype=call.gate_dtype,
            dt_bias_dtype=call.dt_bias_dtype,
            state_dtype=call.state_dtype,
            index_dtype=call.index_dtype,
            separate_write_slots=call.separate_write_slots,
            cache=call.cache,
            write_final_state=call.write_final_state,
            use_qk_l2norm=call.use_qk_l2norm,
            null_slot=call.null_slot,
            cu_seqlens_dtype=call.cu_seqlens_dtype,
            per_token_slots=call.per_token_slots,
            num_accepted=call.num_accepted is not None,
            cache_rows=call.cache_rows is not None,
            uniform_rows=call.uniform_rows,
            exact_slot_table=call.exact_slot_table,
            norm_activation=call.norm_activation,
            norm_weight_dtype=call.norm_weight_dtype,
            conv_width=None if call.conv is None else call.conv.width,
            conv_bias=call.conv is not None and call.conv.bias is not None,
            conv_activation=None if call.conv is None else call.conv.activation,
            pdl=pdl,
            strided_state=call.strided_state,
            accepted_steps_dtype=call.accepted_steps_dtype,
            recovery_steps=call.recovery_steps,
        )

    @property
    def packed(self) -> bool:
        return self.cu_seqlens_dtype is not None

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


def _cute_type(name: str):
    import cutlass

    return {
        "bf16": cutlass.BFloat16,
        "fp16": cutlass.Float16,
        "fp32": cutlass.Float32,
        "int8": cutlass.Int8,
        "fp8_e4m3": cutlass.Float8E4M3FN,
        "int32": cutlass.Int32,
        "int64": cutlass.Int64,
    }[name]


def fake_arguments(key: CompileKey, layout: str) -> list:
    """Stand-ins for launch's arguments, in its order (gdngen.runtime.kernel_args)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

    # Kernel rows (batch rows, or packed sequences) and the token rows of q, k, v, a, b, out:
    # [rows, T, ...] dense, [1, total_tokens, ...] packed.
    rows = cute.sym_int64(symbol="rows")
    if key.packed:
        lead, tokens = 1, cute.sym_int64(symbol="total_tokens")
    else:
        lead, tokens = rows, key.tokens
    pool_size = cute.sym_int64(symbol="pool_size")
    cache_steps = cute.sym_int64(symbol="cache_steps")
    H, HV, K, V = key.H, key.HV, key.K, key.V
    io = _cute_type(key.io_dtype)
    io_vector = VECTOR_ALIGN // ELEMENT_BYTES[key.io_dtype]

    def outer_stride(divisibility: int):
        return cute.sym_int64(divisibility=divisibility)

    def token_rows(heads: int, dim: int):  # [lead, tokens, heads, dim], strided outer dims
        return make_fake_tensor(
            io,
            (lead, tokens, heads, dim),
            (outer_stride(io_vector), outer_stride(io_vector), dim, 1),
            assumed_align=VECTOR_ALIGN,
        )

    def gates(dtype: str):  # [lead, tokens, HV]
        return make_fake_tensor(
            _cute_type(dtype),
            (lead, tokens, HV),
            (outer_stride(1), outer_stride(1), 1),
            assumed_align=ELEMENT_BYTES[dtype],
        )

    def compact(dtype: str, shape: tuple, align: int):
        return make_fake_compact_tensor(
            _cute_type(dtype),
            shape,
            stride_order=tuple(reversed(range(len(shape)))),
            assumed_align=align,
        )

    head = (V, K) if layout == "k_last" else (K, V)
    state_vector = VECTOR_ALIGN // ELEMENT_BYTES[key.state_dtype]
    if key.strided_state:
        head_strides = (outer_stride(state_vector), outer_stride(state_vector))
    else:
        head_strides = (V * K, head[1])
    pool = make_fake_tensor(
        _cute_type(key.state_dtype),
        (pool_size, HV) + head,
        (outer_stride(state_vector), *head_strides, 1),
        assumed_align=VECTOR_ALIGN,
    )
    slots = write_slots = num_accepted = cu_seqlens = cache_rows = accepted_steps = None
    if key.index_dtype is not None:
        index = _cute_type(key.index_dtype)
        index_bytes = ELEMENT_BYTES[key.index_dtype]
        token_scatter = key.per_token_slots and key.separate_write_slots
        if key.per_token_slots and not token_scatter:  # [rows, 1 + S], any row stride
            slots = make_fake_tensor(
                index,
                (rows, cute.sym_int64(symbol="slot_columns")),
                (outer_stride(1), 1),
                assumed_align=index_bytes,
            )
        else:
            slots = compact(key.index_dtype, (rows,), index_bytes)
        if token_scatter:  # FlashInfer's ssm_state_indices [rows, T], any row stride
            write_slots = make_fake_tensor(
                index, (rows, key.tokens), (outer_stride(1), 1), assumed_align=index_bytes
            )
        elif key.separate_write_slots:
            write_slots = compact(key.index_dtype, (rows,), index_bytes)
        if key.num_accepted:
            num_accepted = compact(key.index_dtype, (rows,), index_bytes)
        if key.cache_rows:
            cache_rows = compact(key.index_dtype, (rows,), index_bytes)
    if key.accepted_steps_dtype is not None:
        accepted_steps = compact(
            key.accepted_steps_dtype, (rows,), ELEMENT_BYTES[key.accepted_steps_dtype]
        )
    if key.packed:
        cu_seqlens = compact(
            key.cu_seqlens_dtype,
            (cute.sym_int64(symbol="sequences_plus_one"),),
            ELEMENT_BYTES[key.cu_seqlens_dtype],
        )
    scaled = key.state_dtype in SCALED_STATE_DTYPES
    cache = cache_scales = None
    if key.cache:
        cache_count = cute.sym_int64(symbol="cache_rows") if key.cache_rows else rows
        cache = compact(key.state_dtype, (cache_count, cache_steps, HV) + head, VECTOR_ALIGN)
        if scaled:
            # its rows' scales, as the pool's (gdngen.runtime.pool_checks)
            cache_scales = compact("fp32", (cache_count, cache_steps, HV, V), 4)
    z = norm_weight = None
    if key.norm_activation is not None:
        z = token_rows(HV, V)
        # 16-byte aligned: the epilogue stages it into shared memory with cp.async.
        norm_weight = compact(key.norm_weight_dtype, (V,), VECTOR_ALIGN)
    conv_state = conv_weight = conv_bias = conv_arrivals = conv_windows = None
    if key.conv_width is not None:
        channels = 2 * H * K + HV * V
        # Either layout engines use ([slots, D, columns] or its transpose's view): any strides;
        # W - 1 columns or more (vLLM's slots keep W - 2 + (1 + S) for speculative decoding).
        if key.conv_channels_last:  # [slots, columns, D] viewed: D contiguous, 16-byte aligned
            conv_strides = (outer_stride(io_vector), 1, outer_stride(io_vector))
            conv_align = VECTOR_ALIGN
        else:
            conv_strides = (outer_stride(1), outer_stride(1), outer_stride(1))
            conv_align = ELEMENT_BYTES[key.io_dtype]
        conv_state = make_fake_tensor(
            io,
            (pool_size, channels, cute.sym_int64(symbol="conv_columns")),
            conv_strides,
            assumed_align=conv_align,
        )
        conv_weight = compact(key.io_dtype, (channels, key.conv_width), VECTOR_ALIGN)
        if key.conv_bias:
            conv_bias = compact(key.io_dtype, (channels,), VECTOR_ALIGN)
        conv_arrivals = compact("int32", (pool_size, H), 4)
        if key.cache:
            # The verify cache's windows [R, steps, D, W - 1]: any strides, SGLang's overlapping
            # view of one [R, D, steps + W - 2] buffer included (the kernel stores scalars).
            conv_windows = make_fake_tensor(
                io,
                (cache_count, cache_steps, channels, key.conv_width - 1),
                tuple(outer_stride(1) for _ in range(4)),
                assumed_align=ELEMENT_BYTES[key.io_dtype],
            )
    run_time = {
        "q": token_rows(H, K),
        "k": token_rows(H, K),
        "v": token_rows(HV, V),
        "a": gates(key.gate_dtype),
        "b": gates(key.gate_dtype),
        "A_log": compact("fp32", (HV,), 4),
        "dt_bias": compact(key.dt_bias_dtype, (HV,), ELEMENT_BYTES[key.dt_bias_dtype]),
        "state": pool,
        "read_slots": slots,
        "write_slots": write_slots,
        "num_accepted": num_accepted,
        "cu_seqlens": cu_seqlens,
        "cache_rows": cache_rows,
        "accepted_steps": accepted_steps,
        "out": compact(key.io_dtype, (lead, tokens, HV, V), VECTOR_ALIGN),
        "cache": cache,
        "z": z,
        "norm_weight": norm_weight,
        "conv_state": conv_state,
        "conv_weight": conv_weight,
        "conv_bias": conv_bias,
        "conv_arrivals": conv_arrivals,
        "conv_windows": conv_windows,
        # an int8 state's scales: one per row of each slot's heads (gdngen.runtime.pool_checks)
        "state_scales": compact("fp32", (pool_size, HV, V), 4) if scaled else None,
        "cache_scales": cache_scales,
        # run-time values: any stands in
        "scale": cutlass.Float32(1.0),
        "norm_eps": cutlass.Float32(1e-6),
        "launch_pdl": cutlass.Int32(0),
    }
    return [
        *(
            run_time[arg.name] if not arg.compile_time else option_value(key, arg)
            for arg in KERNEL_ARGS + LAUNCH_ONLY_ARGS
        ),
        make_fake_stream(use_tvm_ffi_env_stream=True),
    ]


def option_value(key: CompileKey, arg: KernelArg):
    """A compile-time argument's value for ``key`` (its default where the feature is off)."""
    value = getattr(key, arg.source)
    return arg.default if value is None else value


def compile_kernel(module: ModuleType, key: CompileKey, *, dump_dir: Path | None = None):
    """Compile ``module.launch`` for ``key``; with ``dump_dir``, keep its PTX and cubin there.
    A decode kernel (a variant of a kernels table, or a test's kernel module), or a target's conv
    step or norm step, whose module names the fake arguments of its launch (``fake_arguments``:
    gdngen.runtime.conv_step, gdngen.runtime.norm_step)."""
    import cutlass.cute as cute

    options = f"--enable-tvm-ffi --gpu-arch={key.arch}"
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        options += f" --keep-ptx --keep-cubin --dump-dir={dump_dir}"
    if getattr(module, "KIND", "decode") != "decode":  # a step kernel
        return cute.compile(module.launch, *module.fake_arguments(key), options=options)
    if not kernel_serves_head_dims(module, key.K, key.V):
        raise ValueError(
            f"{module.NAME} serves K={module.HEAD_K_DIM} and V divisible by {module.TILE_V}; "
            f"the call has K={key.K}, V={key.V}"
        )
    return cute.compile(module.launch, *fake_arguments(key, module.LAYOUT), options=options)
