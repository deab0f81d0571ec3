"""FlashInfer's side of the FlashInfer forms bench (gdngen.bench.fi_forms): its entry for each
form, loaded as an optional peer (as gdngen.measure.impls loads it: never at import time), and
the call each cell's input set makes of it."""

from __future__ import annotations

import importlib
import inspect
from functools import partial
from typing import Callable

from gdngen.bench.fi_forms_inputs import BF16_MTP, MTP, PRETRANSPOSE, FiCell

#: the modules of FlashInfer's entries (the part of an entry's name before its function's)
_MODULES = {entry: entry.rsplit(".", 1)[0] for entry in (PRETRANSPOSE, MTP, BF16_MTP)}


def flashinfer_arguments(cell: FiCell, s: dict, takes_pdl: bool) -> tuple[str, tuple, dict]:
    """FlashInfer's entry for the cell's form and the arguments of its call on set ``s``:
    ``(entry, positional, keywords)``. ``takes_pdl``: whether the pretranspose entry has an
    ``enable_pdl`` keyword (FlashInfer 0.7.2's has none)."""
    entry = cell.form.entry(cell.state_dtype)
    q, k, v, a, b = s["q"], s["k"], s["v"], s["a"], s["b"]
    A_log, dt_bias = s["A_log"], s["dt_bias"]
    if entry == PRETRANSPOSE:
        keywords = dict(
            scale=s["scale"], output=s["out"], use_qk_l2norm=True, initial_state=s["pool"],
            initial_state_indices=s["reads"], output_state_indices=s["writes"],
            backend="flashinfer",  # its generic kernels, not an optional package's
        )  # fmt: skip
        if cell.form.pdl and takes_pdl:
            keywords["enable_pdl"] = True
        return entry, (q, k, v, None, A_log, a, dt_bias, b), keywords
    if entry == MTP:
        positional = (q, k, v, s["pool"], s["reads"], A_log, a, dt_bias, b)
        keywords = dict(
            scale=s["scale"], output=s["out"], ssm_state_indices=s["scatter"],
            disable_state_update=False, use_qk_l2norm=True,
        )  # fmt: skip
        return entry, positional, keywords
    keywords = dict(
        A_log=A_log, a=a, dt_bias=dt_bias, q=q, k=k, v=v, b=b, initial_state_source=s["pool"],
        initial_state_indices=s["reads"], output_state_indices=s["writes"],
        accepted_steps=s["accepted"], ssm_state_indices=s["scatter"],
        disable_state_update=cell.form.accepted == "verify", scale=s["scale"], output=s["out"],
        recovery_steps=cell.recovery_steps,
    )  # fmt: skip
    return entry, (), keywords


class FlashInferForms:
    """FlashInfer's entries of the forms. ``missing`` says why FlashInfer cannot run (not
    importable), else it is None."""

    missing: str | None = None
    version: str | None = None

    def __init__(self) -> None:
        self.functions: dict[str, Callable] = {}
        try:
            for entry, module in _MODULES.items():
                name = entry.rsplit(".", 1)[1]
                self.functions[entry] = getattr(importlib.import_module(module), name)
            self.version = getattr(importlib.import_module("flashinfer"), "__version__", None)
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            self.missing = f"flashinfer not importable ({type(exc).__name__}: {exc})"

    @property
    def takes_pdl(self) -> bool:
        """Whether FlashInfer's pretranspose entry has an ``enable_pdl`` keyword."""
        function = self.functions[PRETRANSPOSE]
        return "enable_pdl" in inspect.signature(function).parameters

    def call(self, cell: FiCell, s: dict) -> Callable[[], object]:
        """FlashInfer's call of the cell's form on set ``s``, ready to run."""
        entry, positional, keywords = flashinfer_arguments(cell, s, self.takes_pdl)
        return partial(self.functions[entry], *positional, **keywords)
