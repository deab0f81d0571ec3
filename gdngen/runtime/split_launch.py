"""A split plan's kernels as one launch (docs/design.md, "The conv1d step apart", "The norm
step apart"): called with the decode kernel's run-time arguments, as a fused plan's kernel is.

- With the conv step: the step convolves the call's rows into the workspace (ConvRows) and
  advances the conv state; the decode kernel reads the workspace as q, k and v, without the
  prologue's tensors.
- With the norm step: the decode kernel runs without the epilogue's tensors, storing the
  recurrence's output; the step normalises it in place.

The call's first kernel takes the call's ``launch_pdl``. A kernel after another takes the
plan's PDL: compiled for it (``pdl``), it overlaps the kernel before's tail whatever that is,
as no kernel writes anything the next reads before its wait.
"""

from __future__ import annotations

from .conv_step import CONV, INDICES, ConvRows
from .kernel_args import RUN_TIME_ARGS
from .norm_step import EPILOGUE_ONLY_AT, TENSORS_AT

#: where the decode kernel's run-time arguments sit in a launch tuple: the ones the split
#: launch reads, looked up once here rather than per call
_AT = {arg.name: index for index, arg in enumerate(RUN_TIME_ARGS)}
_Q, _K, _V, _STATE, _CACHE, _LAUNCH_PDL = (
    _AT[name] for name in ("q", "k", "v", "state", "cache", "launch_pdl")
)
_INDICES_AT = tuple(_AT[name] for name in INDICES)
_CONV_AT = tuple(_AT[name] for name in CONV)
#: what the decode kernel takes only with the prologue: None after the conv step
_PROLOGUE_ONLY_AT = tuple(
    _AT[name]
    for name in ("conv_state", "conv_weight", "conv_bias", "conv_arrivals", "conv_windows")
)


class SplitLaunch:
    """The conv step (with ``rows``, its workspace) where given, the decode ``kernel``, then
    the norm step where given."""

    def __init__(
        self, kernel, pdl: bool, *, conv_step=None, rows: ConvRows | None = None, norm_step=None
    ) -> None:
        if (conv_step is None) != (rows is None):
            raise ValueError("rows: the conv step needs its workspace, and only it does")
        if conv_step is None and norm_step is None:
            raise ValueError("conv_step/norm_step: a split plan splits off at least one step")
        self.kernel, self.conv_step, self.rows, self.norm_step = kernel, conv_step, rows, norm_step
        self.kernel_pdl = int(pdl)

    def __call__(self, *arguments) -> None:
        rest = list(arguments)
        if self.conv_step is not None:
            q, k, v = arguments[_Q], arguments[_K], arguments[_V]
            q_out, k_out, v_out = self.rows.views(q.shape[0], q.shape[1])
            cache = arguments[_CACHE]
            self.conv_step(
                q, k, v, q_out, k_out, v_out,
                *(arguments[at] for at in _INDICES_AT),
                arguments[_STATE].shape[0], 0 if cache is None else cache.shape[0],
                *(arguments[at] for at in _CONV_AT), arguments[_LAUNCH_PDL],
            )  # fmt: skip
            rest[_Q], rest[_K], rest[_V] = q_out, k_out, v_out
            rest[_LAUNCH_PDL] = self.kernel_pdl
            for at in _PROLOGUE_ONLY_AT:
                rest[at] = None
        if self.norm_step is not None:
            for at in EPILOGUE_ONLY_AT:
                rest[at] = None
        self.kernel(*rest)
        if self.norm_step is not None:
            self.norm_step(*(arguments[at] for at in TENSORS_AT), self.kernel_pdl)
