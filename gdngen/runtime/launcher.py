"""The call behind every generated ``gdn_decode``: check, pick a variant, get its kernel, launch.

The first call with a given *signature* runs the full checks (gdngen.runtime.checks), picks the
variant and gets the compiled kernel (gdngen.runtime.store: memory, ahead-of-time artifacts, the
disk cache, then JIT); what it decided is kept under that signature. A later call with the same
signature builds only the signature (:func:`call_key`), then launches: the same checks, made
once per signature (docs/design.md, "Call forms").

The signature holds what the checks read that the compiled kernel's own argument checks do not
cover, and what picks a variant or a compile key. Every kernel is compiled with TVM-FFI, whose
call checks each tensor against the compiled form before anything is launched: dtype, rank,
static dims, the batch size shared between arguments, static strides, the divisibility of the
dynamic ones, base alignment and the device type. The signature adds the rest: the dims that
pick the variant (q and v), the dtypes that pick a compile key, which optional arguments are
given, the pool's strides (overlapping slots, a strided pool) and its size (a dense state), the
cache's steps (>= T), whether the conv state's base is 16-byte aligned (which conv step the
split plan compiles), every tensor's device index and the options. When the kernel refuses an
argument,
the full checks run and raise their error, which names the argument; nothing has been launched.
Nothing here synchronises with the GPU, and the only per-call allocation is the output tensor
when the caller passes none.

Every launch runs on the tensors' device, whichever device is current: if it is another, the
tensors' device is made current for the planning (compile and load) and the launch (docs/design.md,
"Architecture").
"""

from __future__ import annotations

import inspect
import linecache
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from gdngen.terms import conv_step_name, norm_step_name, variant_pair

from .arg_checks import VECTOR_ALIGN
from .checks import Call, check_call, check_index_values
from .compile import CompileKey
from .conv_checks import conv_weight_view as kernel_conv_weight
from .conv_step import (
    ConvRows,
    conv_step_key,
    conv_step_module,
    moves_in_vectors,
    without_prologue,
)
from .norm_step import norm_step_key, norm_step_module, without_norm
from .split_launch import SplitLaunch
from .info import TargetInfo
from .kernel_args import CHECKED, KEYWORDS, RUN_TIME_ARGS
from .pdl import STREAM_WRITES, span_bytes
from .store import kernel_for
from .kernel_table import VariantKernel, load_kernel
from .siblings import wrong_gpu_message
from .views import kernel_views, needs_views
from .workspace import conv_arrivals

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


def launch_device(q):
    """A context making q's CUDA device current (nothing to do when it already is, or when q is
    not a CUDA tensor: the checks then say what is wrong)."""
    if isinstance(q, torch.Tensor) and q.is_cuda and q.get_device() != torch.cuda.current_device():
        return torch.cuda.device(q.device)
    return nullcontext()


def call_key(
    q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
    initial_state_indices, output_state_indices, intermediate_states_buffer,
    disable_state_update, backend, state_layout, null_slot=-1, cu_seqlens=None, max_seqlen=None,
    uniform_seqlen=False, num_accepted_tokens=None, intermediate_state_indices=None,
    ssm_state_indices=None, accepted_steps=None, recovery_steps=0, z=None,
    norm_weight=None, norm_eps=1e-6, norm_activation="silu", conv_state=None, conv_weight=None,
    conv_bias=None, conv_activation="silu", intermediate_conv_windows=None, enable_pdl=None,
    state_scales=None, intermediate_states_scales=None,
) -> tuple:  # fmt: skip
    """The signature of a call in the kernel's form (see the module docstring for what the
    kernel checks instead). AttributeError for an argument that is not a tensor: the full checks
    then say which. A packed call's total token count is not part of it (every call has its own;
    the kernel checks that q, k, v, a, b and the output agree on it), except where the call gives
    no ``max_seqlen``: its T is then the total, up to the target's most (check_call), and the
    total is part of it."""
    pool = state if state is not None else initial_state
    if cu_seqlens is None:
        dims = (q.shape, v.shape)
        packed = None
    else:
        dims = (q.shape[0], q.shape[2:], v.shape[0], v.shape[2:])
        packed = (
            cu_seqlens.dtype,
            cu_seqlens.shape,
            cu_seqlens.get_device(),
            type(max_seqlen),
            max_seqlen,
            # without max_seqlen, the total is the call's T
            q.shape[1] if max_seqlen is None else None,
            # CompileKey.uniform_rows: the caller's promise, never the shapes (docs/design.md),
            # and whether the buffer holds every row's max_seqlen tokens, which it needs
            type(uniform_seqlen),
            uniform_seqlen,
            uniform_seqlen is True
            and max_seqlen is not None
            and q.shape[1] >= (cu_seqlens.shape[0] - 1) * max_seqlen,
        )
    return (
        dims, q.dtype, a.dtype, dt_bias.dtype, pool.dtype, pool.shape,
        pool.stride(), state is None, initial_state is None, q.get_device(), k.get_device(),
        v.get_device(), a.get_device(), b.get_device(), A_log.get_device(),
        dt_bias.get_device(), pool.get_device(),
        None if output is None else output.get_device(),
        None if initial_state_indices is None else (
            initial_state_indices.dtype, initial_state_indices.shape[1:],
            initial_state_indices.get_device(),
        ),
        None if output_state_indices is None else (
            output_state_indices.dtype, output_state_indices.get_device()
        ),
        None if intermediate_states_buffer is None else (
            intermediate_states_buffer.shape[1], intermediate_states_buffer.get_device()
        ),
        packed,
        None if num_accepted_tokens is None else (
            num_accepted_tokens.dtype, num_accepted_tokens.get_device()
        ),
        None if intermediate_state_indices is None else (
            intermediate_state_indices.dtype, intermediate_state_indices.get_device()
        ),
        None if ssm_state_indices is None else (
            ssm_state_indices.dtype, ssm_state_indices.shape[1:], ssm_state_indices.get_device()
        ),
        None if accepted_steps is None else (
            accepted_steps.dtype, accepted_steps.shape[1:], accepted_steps.get_device()
        ),
        None if z is None else (z.dtype, z.shape, z.stride(), z.get_device()),
        None if norm_weight is None else (norm_weight.dtype, norm_weight.get_device()),
        None if conv_state is None else (
            conv_state.dtype, conv_state.shape, conv_state.stride(), conv_state.get_device(),
            # the split plan's conv step moves a 16-byte aligned pool in vectors
            conv_state.data_ptr() % VECTOR_ALIGN == 0,
        ),
        None if conv_weight is None else (
            conv_weight.dtype, conv_weight.shape, conv_weight.stride(), conv_weight.get_device()
        ),
        None if conv_bias is None else (
            conv_bias.dtype, conv_bias.shape, conv_bias.stride(), conv_bias.get_device()
        ),
        None if intermediate_conv_windows is None else (
            intermediate_conv_windows.dtype, intermediate_conv_windows.shape,
            intermediate_conv_windows.get_device(),
        ),
        None if state_scales is None else (
            state_scales.dtype, state_scales.shape, state_scales.stride(),
            state_scales.get_device(),
        ),
        None if intermediate_states_scales is None else (
            intermediate_states_scales.dtype, intermediate_states_scales.get_device()
        ),
        # the options with their types: 1 == True, but the checks refuse the int
        type(scale), scale, type(use_qk_l2norm), use_qk_l2norm, type(disable_state_update),
        disable_state_update, backend, state_layout, type(null_slot), null_slot, type(norm_eps),
        norm_eps, norm_activation, conv_activation, type(enable_pdl), enable_pdl,
        type(recovery_steps), recovery_steps,
    )  # fmt: skip


#: ``DecodeCall.__call__``, written out once from the declared arguments
#: (gdngen.runtime.kernel_args): its signature binds the public keywords, and the call's
#: signature (call_key) and the launch's argument tuple are plain expressions in it, so the
#: per-call path costs what a hand-written one would. Only the argument lists are filled in.
_CALL_SOURCE = """\
def __call__(self, {signature}):
    returned, squeeze = output, None
    if needs_views(q, mixed_qkv, cu_seqlens, a, b, output, z):
        q, k, v, a, b, output, z, squeeze = self._views(
            q, k, v, a, b, output, mixed_qkv, cu_seqlens, z
        )
    try:
        key = call_key({key_arguments})
        plan = None if check_indices else self._plans.get(key)
    except (AttributeError, TypeError, RuntimeError):  # not a (real) tensor: the checks say
        key, plan = None, None
    known = plan is not None
    if not known:
        plan = self._planned(key, dict({checked_arguments}))
    pool = state if state is not None else initial_state
    if output is None:
        output = torch.empty(
            (*q.shape[:2], *plan.head_shape), dtype=plan.output_dtype, device=plan.device
        )
        returned = output if squeeze is None else output.squeeze(squeeze)
    conv_weight_view = None if conv_weight is None else kernel_conv_weight(conv_weight)
    write_slots = output_state_indices if ssm_state_indices is None else ssm_state_indices
    launch_pdl = STREAM_WRITES.launch_pdl(
        plan.pdl, plan.device.index, pool, plan.pool_bytes, conv_state, plan.conv_bytes
    )
    arguments = ({launch_arguments},)
    try:
        if torch.cuda.current_device() == plan.device.index:
            plan.kernel(*arguments)
        else:
            # A kernel launches into the current device's context: make the tensors' device
            # current for the launch (the stream is already theirs: TVM-FFI takes the
            # current stream of the tensors' device).
            with torch.cuda.device(plan.device):
                plan.kernel(*arguments)
    except (ValueError, TypeError):
        if known:  # the kernel refused an argument before launching: the checks say which
            self._plan(dict({checked_arguments}))
        raise
    return returned, pool
"""


def _generated_call():
    """``__call__`` from :data:`_CALL_SOURCE` and the declared arguments; its lines show in
    tracebacks under ``<DecodeCall.__call__>``."""
    key_names = [name for name in CHECKED if name != "check_indices"]
    if list(inspect.signature(call_key).parameters) != key_names:
        raise AssertionError("call_key takes the checked keywords in kernel_args's order")
    positional = [f"{k.name}={k.default!r}" for k in KEYWORDS if k.positional]
    keyword_only = [f"{k.name}={k.default!r}" for k in KEYWORDS if not k.positional]
    source = _CALL_SOURCE.format(
        signature=", ".join(positional + ["*"] + keyword_only),
        key_arguments=", ".join(key_names),
        checked_arguments=", ".join(f"{name}={name}" for name in CHECKED),
        launch_arguments=", ".join(arg.value for arg in RUN_TIME_ARGS),
    )
    filename = "<DecodeCall.__call__>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), globals(), namespace)
    return namespace["__call__"]


@dataclass(frozen=True)
class Choice:
    """What the dispatch picked for a call: the variant, for a call with the conv1d prologue
    whether the conv runs as a kernel of its own first (gdngen.runtime.conv_step), and for a
    call with the gated RMSNorm whether the norm runs as one after (gdngen.runtime.norm_step)."""

    variant: str
    split_conv: bool = False
    split_norm: bool = False
    #: programmatic dependent launch where the caller leaves enable_pdl unset (the rule's)
    pdl: bool = True


@dataclass(frozen=True)
class Plan:
    """What a call of one signature launches."""

    variant: str
    #: the compiled kernel, called with the launch's arguments; in a split plan, its steps and
    #: the kernel (gdngen.runtime.split_launch.SplitLaunch)
    kernel: object
    scale: float
    #: the gated RMSNorm's eps (the kernel's run-time argument; unused without the epilogue)
    norm_eps: float
    #: the output's head dims (HV, V): its leading dims are q's (in the kernel's form)
    head_shape: tuple[int, int]
    output_dtype: torch.dtype
    device: torch.device
    #: the conv1d prologue's reader counts (gdngen.runtime.workspace); None without it (and in
    #: the split plan, whose conv step counts no readers)
    conv_arrivals: torch.Tensor | None = None
    #: whether the conv1d step runs as a kernel of its own before the decode kernel, and the
    #: gated RMSNorm after it (the split plans)
    split_conv: bool = False
    split_norm: bool = False
    #: programmatic dependent launch (the kernel compiled for it), and the bytes of the pools
    #: whose overlap with the last launch's turns it off for one launch (gdngen.runtime.pdl)
    pdl: bool = False
    pool_bytes: int = 0
    conv_bytes: int = 0


class DecodeCall:
    """``gdn_decode(q, k, v, state, A_log, a, dt_bias, b, *, ...) -> (output, state)``.

    FlashInfer-compatible arguments; the state (or pool) is updated in place. Extra keywords:
    ``state_layout`` ("k_last" [.., HV, V, K] or "v_last" [.., HV, K, V]) and ``check_indices``
    (read the slot indices back to the host and reject out-of-range or twice-written slots; this
    synchronises, so it is off by default; the kernels never touch a slot outside the pool).
    With ``z`` (the gate, in the output's form) and ``norm_weight`` [V], the output is the gated
    RMSNorm of the recurrence's, ``o / sqrt(mean(o^2) + norm_eps) * norm_weight *
    norm_activation(z)`` per value head, fused into the kernel (targets with
    ``features.gated_rmsnorm``). With ``conv_state`` [slots, D, W - 1 or more] and ``conv_weight``
    [D, W] (``conv_bias`` [D] optional, ``conv_activation`` "silu" or "identity"), q, k, v (or
    ``mixed_qkv``) are taken before the causal conv1d, which the kernel applies, advancing its
    state in place, slot for slot with the recurrent state (targets with
    ``features.conv1d_widths``; per-token slots: docs/design.md, "The conv1d prologue"). With
    the verify cache as well, ``intermediate_conv_windows`` [R, cache_steps, D, W - 1] receives
    the conv window after every token, at the cache's rows.
    """

    def __init__(
        self,
        name: str,
        info: Callable[[], TargetInfo],
        choose: Callable[[Call], Choice],
        kernels_package: Callable[[], str],
    ) -> None:
        self.__name__ = self.__qualname__ = name
        self._info = info
        self._choose = choose
        self._kernels_package = kernels_package
        self._plans: dict[tuple, Plan] = {}
        self._lock = threading.Lock()

    def module(self, variant: str) -> VariantKernel:
        """``variant``'s kernel (its knobs, device code and host side)."""
        return load_kernel(f"{self._kernels_package()}.{variant}")

    def _plan(self, arguments: dict) -> Plan:
        """The full checks and the kernel for one call (slow path, once per signature)."""
        info = self._info()
        check_indices = arguments.pop("check_indices")
        call = check_call(info, **arguments)
        arch = device_arch(call.pool.device)
        if arch != info.sm:
            device_name = torch.cuda.get_device_name(call.pool.device)
            package = self._kernels_package().rsplit(".", 2)[0]
            raise ValueError(wrong_gpu_message(info, arch, device_name, package))
        if check_indices:
            check_index_values(call)
        choice = self._choose(call)
        variant = choice.variant
        layout, state_dtype = variant_pair(variant)
        if (layout, state_dtype) != (call.layout, call.state_dtype):
            raise ValueError(
                f"state: variant {variant} is a {layout} {state_dtype} kernel; the call passes "
                f"a {call.layout} {call.state_dtype} state"
            )
        pdl = choice.pdl if call.pdl is None else call.pdl
        key = CompileKey.for_call(variant, arch, call, pdl)
        split = choice.split_conv and call.conv is not None
        split_norm = choice.split_norm and call.norm is not None
        q = arguments["q"]
        if split or split_norm:
            kernel = self._split_launch(key, call, q, split, split_norm)
        else:
            kernel = kernel_for(f"{self._kernels_package()}.{variant}", key)
        return Plan(
            variant=variant,
            kernel=kernel,
            scale=call.scale,
            norm_eps=1e-6 if call.norm is None else call.norm.eps,
            head_shape=(call.HV, call.V),
            output_dtype=q.dtype,
            device=q.device,
            conv_arrivals=(
                None if call.conv is None or split else conv_arrivals(call.conv.state, call.H)
            ),
            split_conv=split,
            split_norm=split_norm,
            pdl=pdl,
            pool_bytes=span_bytes(call.pool),
            conv_bytes=0 if call.conv is None else span_bytes(call.conv.state),
        )

    def _split_launch(
        self, key: CompileKey, call: Call, q: torch.Tensor, conv: bool, norm: bool
    ) -> SplitLaunch:
        """A split plan's kernels: the conv step and its workspace (with views for this call's
        token rows made now, outside any capture) where ``conv``, the decode kernel without what
        the steps do, and the norm step where ``norm``."""
        package = self._kernels_package()
        steps: dict = {}
        kernel_key = key
        if conv:
            step = conv_step_module(package, key.arch)
            channels_last = moves_in_vectors(call.conv.state)
            steps["conv_step"] = kernel_for(
                step, conv_step_key(key, step.rpartition(".")[2], channels_last)
            )
            steps["rows"] = ConvRows(call.H, call.K, call.HV, call.V, q.dtype, q.device)
            steps["rows"].views(q.shape[0], q.shape[1])
            kernel_key = without_prologue(kernel_key)
        if norm:
            step = norm_step_module(package, key.arch)
            steps["norm_step"] = kernel_for(step, norm_step_key(key, step.rpartition(".")[2]))
            kernel_key = without_norm(kernel_key)
        kernel = kernel_for(f"{package}.{key.variant}", kernel_key)
        return SplitLaunch(kernel, key.pdl, **steps)

    __call__ = _generated_call()

    def _views(self, q, k, v, a, b, output, mixed_qkv, cu_seqlens, z) -> tuple:
        """q, k, v, a, b, output, z in the kernel's form (gdngen.runtime.views), and the dim the
        caller's output lacks (None: the same form)."""
        views = kernel_views(
            self._info(), q=q, k=k, v=v, a=a, b=b, output=output, mixed_qkv=mixed_qkv,
            cu_seqlens=cu_seqlens, z=z,
        )  # fmt: skip
        return (
            views.q, views.k, views.v, views.a, views.b, views.output, views.z,
            views.output_squeeze,
        )  # fmt: skip

    def _planned(self, key: tuple | None, arguments: dict) -> Plan:
        """The plan of a call not seen before (``arguments`` as check_call takes them, with
        ``check_indices``), remembered under its signature."""
        with launch_device(arguments["q"]):
            plan = self._plan(arguments)
        if key is not None:
            with self._lock:
                if len(self._plans) >= MAX_SIGNATURES:
                    self._plans.clear()
                self._plans[key] = plan
        return plan

    #: the keywords check_call takes, with the call's defaults (``prepare`` starts from these)
    CHECKED = CHECKED

    def prepare(
        self,
        q=None,
        k=None,
        v=None,
        state=None,
        A_log=None,
        a=None,
        dt_bias=None,
        b=None,
        **options,
    ) -> str:
        """Check the inputs and get the kernel that a call with them would launch, without
        launching it (do this before capturing a CUDA graph). Returns the variant's name; where
        a split plan runs a step, the kernels in order: ``"conv_step_sm90 + <variant>"``,
        ``"<variant> + norm_step_sm90"``."""
        arguments = dict(
            self.CHECKED, q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b
        )
        mixed_qkv = options.pop("mixed_qkv", None)
        unknown = set(options) - set(arguments)
        if unknown:
            raise TypeError(f"prepare: unexpected keyword argument(s) {sorted(unknown)}")
        arguments.update(options)
        z = arguments["z"]
        output, cu_seqlens = arguments["output"], arguments["cu_seqlens"]
        if needs_views(q, mixed_qkv, cu_seqlens, a, b, output, z):
            lifted = self._views(q, k, v, a, b, output, mixed_qkv, cu_seqlens, z)
            arguments.update(zip(("q", "k", "v", "a", "b", "output", "z"), lifted))
        with launch_device(arguments["q"]):
            plan = self._plan(arguments)
        arch = device_arch(plan.device)
        return " + ".join(
            [conv_step_name(arch)] * plan.split_conv
            + [plan.variant]
            + [norm_step_name(arch)] * plan.split_norm
        )

    def signatures(self) -> int:
        """How many call signatures this call has planned (tests use it)."""
        return len(self._plans)
