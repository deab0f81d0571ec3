"""The kernel's view of the engine forms whose tensors are laid out otherwise (no copies).

The kernels read q, k, v as ``[lead, tokens, heads, dim]`` and a, b as ``[lead, tokens, HV]``
(docs/design.md, "Call forms"). Two engine forms are turned into that here, as strided views:

- **Packed tokens without the leading 1**: with ``cu_seqlens``, q, k, v may be
  ``[total_tokens, heads, dim]``, a and b ``[total_tokens, HV]`` and the output (and the gated
  RMSNorm's z) ``[total_tokens, HV, V]``; they gain the leading 1 of ``[1, total_tokens, ...]``.
- **mixed_qkv**: one post-convolution buffer whose rows hold q, k and v side by side,
  ``[tokens, 2*H*K + HV*V]`` (or ``[B, T, width]``, ``[1, total_tokens, width]``); q, k and v become
  views of its columns, with the buffer's row stride. A dense ``[B, width]`` buffer is one token
  per row (T = 1), as are a and b given as ``[B, HV]``.

Errors name the argument the caller passed (``mixed_qkv``, ``a``, ...), before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .arg_checks import VECTOR_ALIGN, require_dtype, require_tensor, shape_text
from .form_checks import IO_DTYPES
from .info import TargetInfo

#: (target name, row width, HV) -> (H, K, HV, V), for the geometry a mixed_qkv width names
_mixed_geometry: dict[tuple[str, int, int], tuple[int, int, int, int]] = {}


@dataclass(frozen=True)
class KernelViews:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    #: the output in the kernel's form, or None when the call allocates it
    output: torch.Tensor | None
    #: the dim of the kernel's output that the caller's form does not have (None: same form)
    output_squeeze: int | None
    #: the gated RMSNorm's gate in the output's form (None without the epilogue)
    z: torch.Tensor | None = None


def needs_views(q, mixed_qkv, cu_seqlens, a=None, b=None, output=None, z=None) -> bool:
    """Whether a call is in one of the forms above (cheap: checked on every call): mixed_qkv, or
    a packed call with any of q, a, b, output, z in its flat token form."""
    if mixed_qkv is not None:
        return True
    if cu_seqlens is None:
        return False
    return any(
        getattr(tensor, "ndim", 0) == flat
        for tensor, flat in ((q, 3), (a, 2), (b, 2), (output, 3), (z, 3))
    )


def mixed_geometry(info: TargetInfo, width: int, HV: int) -> tuple[int, int, int, int]:
    """The served geometry whose rows are ``2*H*K + HV*V`` wide with this HV."""
    key = (info.name, width, HV)
    found = _mixed_geometry.get(key)
    if found is None:
        matches = {
            (g.H, g.K, g.HV, g.V)
            for g in info.geometries
            if g.HV == HV and 2 * g.H * g.K + g.HV * g.V == width
        }
        if len(matches) != 1:
            served = ", ".join(
                f"{g.name}: 2*{g.H}*{g.K} + {g.HV}*{g.V} = {2 * g.H * g.K + g.HV * g.V}"
                for g in info.geometries
            )
            what = "is ambiguous among" if matches else "matches none of"
            raise ValueError(
                f"mixed_qkv: a row width of {width} with HV={HV} (from a) {what} the geometries "
                f"of target {info.name} (2*H*K + HV*V: {served})"
            )
        found = _mixed_geometry[key] = matches.pop()
    return found


def _split_mixed(info: TargetInfo, mixed: torch.Tensor, HV: int, packed: bool):
    require_dtype("mixed_qkv", mixed, IO_DTYPES)
    if mixed.dim() not in (2, 3) or (packed and mixed.dim() == 3 and mixed.size(0) != 1):
        form = (
            "[total_tokens, width] or [1, total_tokens, width]"
            if packed
            else ("[B, width] (one token per row) or [B, T, width]")
        )
        raise ValueError(f"mixed_qkv: expected shape {form}; got {shape_text(mixed)}")
    H, K, HV, V = mixed_geometry(info, mixed.size(-1), HV)
    if mixed.size(-1) > 1 and mixed.stride(-1) != 1:
        raise ValueError(
            f"mixed_qkv: its rows must be contiguous (strides {tuple(mixed.stride())}); the "
            "rows themselves may have any stride"
        )
    vector = VECTOR_ALIGN // mixed.element_size()
    if mixed.data_ptr() % VECTOR_ALIGN or H * K % vector:
        raise ValueError(
            f"mixed_qkv: q, k and v must each start {VECTOR_ALIGN}-byte aligned for vector loads; "
            f"got address {mixed.data_ptr():#x} with q {H}*{K} elements wide"
        )
    if mixed.dim() == 2:
        rows = mixed.size(0)
        lead, strides = ((1, rows) if packed else (rows, 1)), (mixed.stride(0), mixed.stride(0))
    else:
        lead, strides = tuple(mixed.shape[:2]), tuple(mixed.stride()[:2])
    for stride in strides:
        if stride % vector:
            raise ValueError(
                f"mixed_qkv: its row stride must be a multiple of {vector} elements "
                f"({VECTOR_ALIGN} bytes); got strides {tuple(mixed.stride())}"
            )
    base = mixed.storage_offset()
    q = mixed.as_strided(lead + (H, K), strides + (K, 1), base)
    k = mixed.as_strided(lead + (H, K), strides + (K, 1), base + H * K)
    v = mixed.as_strided(lead + (HV, V), strides + (V, 1), base + 2 * H * K)
    return q, k, v


def kernel_views(
    info: TargetInfo, *, q, k, v, a, b, output, mixed_qkv, cu_seqlens, z=None
) -> KernelViews:
    """q, k, v, a, b and output as the kernel takes them (see the module docstring)."""
    packed = cu_seqlens is not None
    token_dim = 0 if packed else 1  # the dim a one-dim token form lacks
    a = require_tensor("a", a)
    b = require_tensor("b", b)
    if mixed_qkv is not None:
        mixed = require_tensor("mixed_qkv", mixed_qkv)
        given = [name for name, t in (("q", q), ("k", k), ("v", v)) if t is not None]
        if given:
            raise ValueError(f"{'/'.join(given)}: pass q, k, v or mixed_qkv, not both")
        q, k, v = _split_mixed(info, mixed, a.size(-1), packed)
        flat = mixed.dim() == 2
    else:
        q = require_tensor("q", q)
        flat = q.dim() == 3
        if flat:
            k = require_tensor("k", k)
            v = require_tensor("v", v)
            q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    if a.dim() == 2:
        a = a.unsqueeze(token_dim)
    if b.dim() == 2:
        b = b.unsqueeze(token_dim)
    squeeze = token_dim if packed and flat else None
    if output is not None:
        output = require_tensor("output", output)
        if output.dim() == 3:
            output = output.unsqueeze(token_dim)
            squeeze = token_dim
        else:
            squeeze = None
    if isinstance(z, torch.Tensor) and z.dim() == 3:  # the output's one-dim token form
        z = z.unsqueeze(token_dim)
    return KernelViews(q, k, v, a, b, output, squeeze, z)
