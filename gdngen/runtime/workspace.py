"""Device memory the kernels keep between calls: the conv1d prologue's reader counts.

``conv_arrivals`` ``[slots, H]`` int32 counts, per conv slot and key head, the CTAs done reading
its q/k conv state (gdngen.device.conv). Every call leaves the counts it used at zero, so one
zeroed tensor serves every call on a pool of that many slots: it is made once per (device, slots,
H), when a call signature is planned (never on the hot path), and kept. Calls running at once on
different streams must not share a slot, as for the states themselves.

Made during CUDA-graph capture, the zeroing would be recorded instead of run, so planning refuses
that: plan first (an eager call, or ``gdn_decode.prepare`` / ``warmup``), then capture.
"""

from __future__ import annotations

import threading

import torch

_arrivals: dict[tuple[int, int, int], torch.Tensor] = {}
_lock = threading.Lock()


def conv_arrivals(conv_state: torch.Tensor, H: int) -> torch.Tensor:
    """The zeroed reader counts for a conv state pool of ``conv_state``'s slots and device."""
    device = conv_state.device
    key = (device.index, conv_state.size(0), H)
    with _lock:
        counts = _arrivals.get(key)
        if counts is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "conv_state: the first call with a conv pool of this size makes its reader "
                    "counts (zeroed device memory); a CUDA graph capture would record the zeroing "
                    "instead of running it. Call gdn_decode (or gdn_decode.prepare) once before "
                    "capturing"
                )
            counts = _arrivals[key] = torch.zeros(
                conv_state.size(0), H, dtype=torch.int32, device=device
            )
    return counts
