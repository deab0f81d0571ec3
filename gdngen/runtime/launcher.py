"""The call behind every generated ``gdn_decode``: check, pick a variant, get its kernel, launch.

The first call with a given *signature* (every tensor's shape, strides, dtype, device and base
alignment, and every option) runs the full checks (gdngen.runtime.checks), picks the variant and
gets the compiled kernel (gdngen.runtime.store: memory, ahead-of-time artifacts, the disk cache,
then JIT). What it decided is kept under that signature, so a later call with the same signature
only builds the signature to notice any change, then launches: the same checks, made once per
signature (docs/design.md, "Call forms"). Nothing here synchronises with the GPU, and the only
per-call allocation is the output tensor when the caller passes none.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import torch

from gdngen.terms import variant_pair

from .checks import Call, check_call, check_index_values
from .compile import CompileKey
from .info import TargetInfo
from .store import kernel_for

_device_arch: dict[int, str] = {}
#: signatures remembered per call object; past this many the memory starts over (a server sees a
#: few per batch size and token count, so this is only a bound against unbounded growth)
MAX_SIGNATURES = 4096


def device_arch(device: torch.device) -> str:
    """The SM target of a CUDA device, e.g. sm_90a for an H100/H200."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    arch = _device_arch.get(index)
    if arch is None:
        major, minor = torch.cuda.get_device_capability(index)
        arch = _device_arch[index] = f"sm_{major}{minor}a"
    return arch


def _signature(tensor) -> tuple | None:
    """What the checks read of one tensor argument: any change of it is a new signature.
    (AttributeError for a non-tensor: the checks then say what was expected.)"""
    if tensor is None:
        return None
    return (
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
        tensor.get_device(),
        tensor.data_ptr() & 15,
    )


@dataclass(frozen=True)
class Plan:
    """What a call of one signature launches."""

    variant: str
    kernel: object
    scale: float
    output_shape: tuple[int, ...]
    output_dtype: torch.dtype
    device: torch.device


class DecodeCall:
    """``gdn_decode(q, k, v, state, A_log, a, dt_bias, b, *, ...) -> (output, state)``.

    FlashInfer-compatible arguments; the state (or pool) is updated in place. Extra keywords:
    ``state_layout`` ("k_last" [.., HV, V, K] or "v_last" [.., HV, K, V]) and ``check_indices``
    (read the slot indices back to the host and reject out-of-range or twice-written slots; this
    synchronises, so it is off by default; the kernels never touch a slot outside the pool).
    """

    def __init__(
        self,
        name: str,
        info: Callable[[], TargetInfo],
        choose: Callable[[Call], str],
        kernels_package: Callable[[], str],
    ) -> None:
        self.__name__ = self.__qualname__ = name
        self._info = info
        self._choose = choose
        self._kernels_package = kernels_package
        self._plans: dict[tuple, Plan] = {}
        self._lock = threading.Lock()

    def module(self, variant: str) -> ModuleType:
        return importlib.import_module(f"{self._kernels_package()}.{variant}")

    def _plan(self, arguments: dict) -> tuple[Call, Plan]:
        """The full checks and the kernel for one call (slow path, once per signature)."""
        info = self._info()
        check_indices = arguments.pop("check_indices")
        call = check_call(info, **arguments)
        arch = device_arch(call.pool.device)
        if arch != info.sm:
            raise ValueError(
                f"q: target {info.name} is built for {info.sm}; the tensors are on a {arch} GPU "
                f"({torch.cuda.get_device_name(call.pool.device)}). Use the target emitted for it."
            )
        if check_indices:
            check_index_values(call)
        variant = self._choose(call)
        layout, state_dtype = variant_pair(variant)
        if (layout, state_dtype) != (call.layout, call.state_dtype):
            raise ValueError(
                f"state: variant {variant} is a {layout} {state_dtype} kernel; the call passes "
                f"a {call.layout} {call.state_dtype} state"
            )
        kernel = kernel_for(
            f"{self._kernels_package()}.{variant}", CompileKey.for_call(variant, arch, call)
        )
        plan = Plan(
            variant=variant,
            kernel=kernel,
            scale=call.scale,
            output_shape=(call.batch, call.tokens, call.HV, call.V),
            output_dtype=arguments["q"].dtype,
            device=arguments["q"].device,
        )
        return call, plan

    def __call__(
        self,
        q,
        k,
        v,
        state,
        A_log,
        a,
        dt_bias,
        b,
        *,
        scale=None,
        output=None,
        use_qk_l2norm=True,
        initial_state=None,
        initial_state_indices=None,
        output_state_indices=None,
        intermediate_states_buffer=None,
        disable_state_update=False,
        state_layout="k_last",
        check_indices=False,
    ):
        try:
            # Options keyed with their types: 1 == True, but check_call refuses the int.
            key = (
                _signature(q), _signature(k), _signature(v), _signature(state),
                _signature(A_log), _signature(a), _signature(dt_bias), _signature(b),
                _signature(output), _signature(initial_state),
                _signature(initial_state_indices), _signature(output_state_indices),
                _signature(intermediate_states_buffer), type(scale), scale,
                type(use_qk_l2norm), use_qk_l2norm, type(disable_state_update),
                disable_state_update, state_layout,
            )  # fmt: skip
            plan = None if check_indices else self._plans.get(key)
        except (AttributeError, TypeError, RuntimeError):  # not a (real) tensor: the checks say
            key, plan = None, None
        if plan is None:
            arguments = dict(
                q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, scale=scale,
                output=output, use_qk_l2norm=use_qk_l2norm, initial_state=initial_state,
                initial_state_indices=initial_state_indices,
                output_state_indices=output_state_indices,
                intermediate_states_buffer=intermediate_states_buffer,
                disable_state_update=disable_state_update, state_layout=state_layout,
                check_indices=check_indices,
            )  # fmt: skip
            _, plan = self._plan(arguments)
            if key is not None:
                with self._lock:
                    if len(self._plans) >= MAX_SIGNATURES:
                        self._plans.clear()
                    self._plans[key] = plan
        pool = state if state is not None else initial_state
        if output is None:
            output = torch.empty(plan.output_shape, dtype=plan.output_dtype, device=plan.device)
        plan.kernel(
            q, k, v, a, b, A_log, dt_bias, pool, initial_state_indices, output_state_indices,
            output, intermediate_states_buffer, plan.scale,
        )  # fmt: skip
        return output, pool

    def prepare(self, q, k, v, state, A_log, a, dt_bias, b, **options) -> str:
        """Check the inputs and get the kernel that a call with them would launch, without
        launching it (do this before capturing a CUDA graph). Returns the variant's name."""
        arguments = dict(
            q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, scale=None,
            output=None, use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
            output_state_indices=None, intermediate_states_buffer=None,
            disable_state_update=False, state_layout="k_last", check_indices=False,
        )  # fmt: skip
        unknown = set(options) - set(arguments)
        if unknown:
            raise TypeError(f"prepare: unexpected keyword argument(s) {sorted(unknown)}")
        arguments.update(options)
        _, plan = self._plan(arguments)
        return plan.variant

    def signatures(self) -> int:
        """How many call signatures this call has planned (tests use it)."""
        return len(self._plans)
