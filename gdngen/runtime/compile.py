"""Compiling a kernel module for one set of compile-time inputs, and the key that names it.

Batch size, pool size, cache_steps and the outer strides of q/k/v/a/b/pool are run-time values
(one compiled kernel serves every batch); everything else is in :class:`CompileKey`. Compiling
needs no GPU: fake tensors stand in for the arguments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from .checks import VECTOR_ALIGN, Call

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int32": 4, "int64": 8}


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

    @classmethod
    def for_call(cls, variant: str, arch: str, call: Call) -> "CompileKey":
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
        )

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


def _cute_type(name: str):
    import cutlass

    return {
        "bf16": cutlass.BFloat16,
        "fp16": cutlass.Float16,
        "fp32": cutlass.Float32,
        "int32": cutlass.Int32,
        "int64": cutlass.Int64,
    }[name]


def fake_arguments(key: CompileKey, layout: str) -> list:
    """Stand-ins for launch's arguments, in its order (the compile-time ones last)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

    batch = cute.sym_int64(symbol="batch")
    pool_size = cute.sym_int64(symbol="pool_size")
    cache_steps = cute.sym_int64(symbol="cache_steps")
    T, H, HV, K, V = key.tokens, key.H, key.HV, key.K, key.V
    io = _cute_type(key.io_dtype)
    io_vector = VECTOR_ALIGN // ELEMENT_BYTES[key.io_dtype]

    def outer_stride(divisibility: int):
        return cute.sym_int64(divisibility=divisibility)

    def rows(heads: int, dim: int):  # [B, T, heads, dim], strided outer dims, dense inner dims
        return make_fake_tensor(
            io,
            (batch, T, heads, dim),
            (outer_stride(io_vector), outer_stride(io_vector), dim, 1),
            assumed_align=VECTOR_ALIGN,
        )

    def gates(dtype: str):  # [B, T, HV]
        return make_fake_tensor(
            _cute_type(dtype),
            (batch, T, HV),
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
    pool = make_fake_tensor(
        _cute_type(key.state_dtype),
        (pool_size, HV) + head,
        (outer_stride(state_vector), V * K, head[1], 1),
        assumed_align=VECTOR_ALIGN,
    )
    slots = None
    write_slots = None
    if key.index_dtype is not None:
        slots = compact(key.index_dtype, (batch,), ELEMENT_BYTES[key.index_dtype])
        if key.separate_write_slots:
            write_slots = compact(key.index_dtype, (batch,), ELEMENT_BYTES[key.index_dtype])
    cache = None
    if key.cache:
        cache = compact(key.state_dtype, (batch, cache_steps, HV) + head, VECTOR_ALIGN)
    return [
        rows(H, K),  # q
        rows(H, K),  # k
        rows(HV, V),  # v
        gates(key.gate_dtype),  # a
        gates(key.gate_dtype),  # b
        compact("fp32", (HV,), 4),  # A_log
        compact(key.dt_bias_dtype, (HV,), ELEMENT_BYTES[key.dt_bias_dtype]),  # dt_bias
        pool,
        slots,
        write_slots,
        compact(key.io_dtype, (batch, T, HV, V), VECTOR_ALIGN),  # out
        cache,
        cutlass.Float32(1.0),  # scale (a run-time value)
        T,
        key.use_qk_l2norm,
        key.write_final_state,
        make_fake_stream(use_tvm_ffi_env_stream=True),
    ]


def compile_kernel(module: ModuleType, key: CompileKey, *, dump_dir: Path | None = None):
    """Compile ``module.launch`` for ``key``; with ``dump_dir``, keep its PTX and cubin there."""
    import cutlass.cute as cute

    if key.K != module.HEAD_K_DIM or key.V % module.TILE_V:
        raise ValueError(
            f"{module.NAME} serves K={module.HEAD_K_DIM} and V divisible by {module.TILE_V}; "
            f"the call has K={key.K}, V={key.V}"
        )
    options = f"--enable-tvm-ffi --gpu-arch={key.arch}"
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        options += f" --keep-ptx --keep-cubin --dump-dir={dump_dir}"
    return cute.compile(module.launch, *fake_arguments(key, module.LAYOUT), options=options)
