"""Checks of one argument of a call: each raises a TypeError (wrong kind or dtype) or a
ValueError (wrong shape, layout, alignment, range) whose message names the argument, what was
expected and what was given. The call's checks (gdngen.runtime.checks), the fused core's
(``norm_checks``, ``conv_checks``) and the engine views' (``views``) are built of them.
"""

from __future__ import annotations

import torch

#: byte alignment the kernels assume for the base of every vector-loaded tensor
VECTOR_ALIGN = 16


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def shape_text(tensor: torch.Tensor) -> str:
    return "[" + ", ".join(str(d) for d in tensor.shape) + "]"


def require_tensor(name: str, value: object, *, optional: bool = False) -> torch.Tensor | None:
    if value is None:
        if optional:
            return None
        raise TypeError(f"{name}: expected a torch.Tensor, got None")
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    return value


def require_dtype(name: str, tensor: torch.Tensor, allowed: dict) -> str:
    if tensor.dtype not in allowed:
        options = ", ".join(dtype_name(d) for d in allowed)
        raise TypeError(f"{name}: expected dtype {options}; got {dtype_name(tensor.dtype)}")
    return allowed[tensor.dtype]


def require_dims(name: str, tensor: torch.Tensor, expected: tuple, meaning: str) -> None:
    """``expected`` holds ints or None (any size) per dim; ``meaning`` spells the dims."""
    ok = tensor.dim() == len(expected) and all(
        want is None or got == want for got, want in zip(tensor.shape, expected)
    )
    if not ok:
        shown = ", ".join("*" if d is None else str(d) for d in expected)
        raise ValueError(f"{name}: expected shape {meaning} = [{shown}]; got {shape_text(tensor)}")


def require_inner_contiguous(name: str, tensor: torch.Tensor, inner: int, meaning: str) -> None:
    """The last ``inner`` dims must be dense row-major (outer dims may be strided)."""
    expected = 1
    for dim in range(tensor.dim() - 1, tensor.dim() - 1 - inner, -1):
        if tensor.size(dim) > 1 and tensor.stride(dim) != expected:
            raise ValueError(
                f"{name}: its last {inner} dim(s) {meaning} must be contiguous "
                f"(strides {tuple(tensor.stride())} given); pass .contiguous() or a dense view"
            )
        expected *= tensor.size(dim)


def require_contiguous(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise ValueError(
            f"{name}: must be contiguous (shape {shape_text(tensor)}, strides {tuple(tensor.stride())}); "
            f"it is written in place, so a copy would silently lose the result"
        )


def require_aligned(
    name: str, tensor: torch.Tensor, elems_per_vector: int, outer_dims: int
) -> None:
    """Base address 16-byte aligned and every outer stride a whole number of vectors."""
    if tensor.data_ptr() % VECTOR_ALIGN:
        raise ValueError(
            f"{name}: data pointer must be {VECTOR_ALIGN}-byte aligned for vector loads; "
            f"got address {tensor.data_ptr():#x}"
        )
    for dim in range(outer_dims):
        if tensor.stride(dim) % elems_per_vector:
            raise ValueError(
                f"{name}: stride of dim {dim} must be a multiple of {elems_per_vector} elements "
                f"({VECTOR_ALIGN} bytes); got {tensor.stride(dim)}"
            )


def require_int(name: str, value, lowest: int, highest: int | None, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int ({what}); got {type(value).__name__}")
    if value < lowest or (highest is not None and value > highest):
        upper = "" if highest is None else f"..{highest}"
        raise ValueError(f"{name}: expected {lowest}{upper or ' or more'} ({what}); got {value}")
    return value
