"""The call behind every generated ``gdn_decode``: check, pick a variant, compile once, launch.

Compiled kernels live in one process-wide cache keyed by (kernel module, CompileKey), shared by
the dispatching call and the per-variant calls. Nothing here synchronises with the GPU, and the
only per-call allocation is the output tensor when the caller passes none.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Callable

import torch

from .checks import Call, check_call, check_index_values
from .compile import CompileKey, compile_kernel
from .info import TargetInfo

_compiled: dict[tuple[str, CompileKey], object] = {}
_compile_lock = threading.Lock()
_device_arch: dict[int, str] = {}


def device_arch(device: torch.device) -> str:
    """The SM target of a CUDA device, e.g. sm_90a for an H100/H200."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    arch = _device_arch.get(index)
    if arch is None:
        major, minor = torch.cuda.get_device_capability(index)
        arch = _device_arch[index] = f"sm_{major}{minor}a"
    return arch


def compiled_kernel(module: ModuleType, key: CompileKey):
    cache_key = (module.__name__, key)
    kernel = _compiled.get(cache_key)
    if kernel is None:
        with _compile_lock:
            kernel = _compiled.get(cache_key)
            if kernel is None:
                kernel = _compiled[cache_key] = compile_kernel(module, key)
    return kernel


def compiled_count() -> int:
    """How many kernels this process has compiled (tests use it to catch recompiles)."""
    return len(_compiled)


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

    def module(self, variant: str) -> ModuleType:
        return importlib.import_module(f"{self._kernels_package()}.{variant}")

    def _plan(self, arguments: dict) -> tuple[Call, object]:
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
        module = self.module(variant)
        if (module.LAYOUT, module.KNOBS["state_dtype"]) != (call.layout, call.state_dtype):
            raise ValueError(
                f"state: variant {variant} is a {module.LAYOUT} {module.KNOBS['state_dtype']} "
                f"kernel; the call passes a {call.layout} {call.state_dtype} state"
            )
        return call, compiled_kernel(module, CompileKey.for_call(variant, arch, call))

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
        arguments = dict(locals())
        del arguments["self"]
        call, kernel = self._plan(arguments)
        if output is None:
            output = torch.empty(
                (call.batch, call.tokens, call.HV, call.V), dtype=q.dtype, device=q.device
            )
        kernel(
            q,
            k,
            v,
            a,
            b,
            A_log,
            dt_bias,
            call.pool,
            call.read_slots,
            call.write_slots,
            output,
            call.cache_buffer,
            call.scale,
        )
        return output, call.pool

    def prepare(self, q, k, v, state, A_log, a, dt_bias, b, **options) -> str:
        """Check the inputs and compile the kernel that a call with them would launch, without
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
        call, _ = self._plan(arguments)
        return self._choose(call)
