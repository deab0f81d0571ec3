"""The one reference every test and benchmark compares with, in float64 (docs/design.md, "The
math"): the recurrence in every call form (:mod:`.decode`), and the steps around it in an
engine's decode core, the causal conv1d update of the packed q/k/v (:mod:`.conv`) and the gated
RMSNorm of the output (:mod:`.norm`), chained by :mod:`.core`; and the storage formats of the
state, as round trips (:mod:`.state_formats`).
"""

from .conv import CONV_STATE_LAYOUTS, causal_conv1d_update, conv_windows
from .core import CoreResult, reference_decode_core, split_mixed_qkv
from .decode import (
    ExpectedCall,
    ReferenceResult,
    gates,
    l2_normalize,
    recurrence,
    reference_call,
    reference_decode,
    softplus,
)
from .norm import NORM_ACTIVATIONS, gated_rmsnorm

__all__ = [
    "CONV_STATE_LAYOUTS",
    "CoreResult",
    "ExpectedCall",
    "NORM_ACTIVATIONS",
    "ReferenceResult",
    "causal_conv1d_update",
    "conv_windows",
    "gated_rmsnorm",
    "gates",
    "l2_normalize",
    "recurrence",
    "reference_call",
    "reference_decode",
    "reference_decode_core",
    "softplus",
    "split_mixed_qkv",
]
