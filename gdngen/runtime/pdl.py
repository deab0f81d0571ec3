"""Programmatic dependent launch, the host's part: whether a launch may overlap the kernel before
it on its stream (docs/design.md, "Programmatic dependent launch").

A kernel compiled with PDL (``CompileKey.pdl``) loads the state, its weights and its index tables
before it waits for the grid before it, so that those loads overlap that grid's tail. That is
correct only if that grid does not write them. An engine's producer (its projection, its conv
kernel) writes none of them; but a gdngen call straight after another one on the same state pool
would read the pool before the first call's stores are visible. So every call records here, per
stream, the memory it may write that a later call reads before its wait (the state pool and the
conv pool), and a PDL launch whose pools overlap that record is launched without the attribute:
the kernel's ``griddepcontrol.wait`` is then a no-op and the stream orders the two as usual.

What this cannot see: kernels other than gdngen's. A kernel launched just before a PDL call on
its stream must not write the state pool, the conv pool, ``A_log``, ``dt_bias``, the conv and
norm weights or the index tables (docs/engines.md says what that asks of an engine).
"""

from __future__ import annotations

import torch


def span_bytes(tensor: torch.Tensor | None) -> int:
    """The bytes from a tensor's first element to past its last one (0 for None)."""
    if tensor is None or tensor.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


def _raw_stream(device_index: int) -> int:
    """The current stream's handle on the device, without making a Stream object."""
    return torch.cuda.current_stream(device_index).cuda_stream


current_stream_handle = getattr(torch._C, "_cuda_getCurrentRawStream", _raw_stream)


class StreamWrites:
    """Per (device, stream), the byte ranges the last gdngen launch there may have written that
    a later launch reads before its grid-dependency wait."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, int], tuple] = {}

    def launch_pdl(
        self,
        pdl: bool,
        device_index: int,
        pool: torch.Tensor,
        pool_bytes: int,
        conv_state: torch.Tensor | None,
        conv_bytes: int,
    ) -> int:
        """Record this launch's pools and return the launch's PDL attribute: 1 where ``pdl`` and
        the last gdngen launch on this stream wrote neither pool, else 0."""
        stream = (device_index, current_stream_handle(device_index))
        start = pool.data_ptr()
        ranges = ((start, start + pool_bytes),)
        if conv_state is not None:
            conv = conv_state.data_ptr()
            ranges += ((conv, conv + conv_bytes),)
        before = self._last.get(stream)
        self._last[stream] = ranges
        if not pdl:
            return 0
        if before is not None:
            for first, end in ranges:
                for written_first, written_end in before:
                    if first < written_end and written_first < end:
                        return 0
        return 1

    def hold_off(self, device_index: int) -> None:
        """Record a write over all memory on the current stream, so that the next gdngen launch
        there waits for the kernel before it in full: for a caller that knows that kernel
        wrote the call's pools (benches time a PDL kernel without its overlap this way)."""
        self._last[(device_index, current_stream_handle(device_index))] = ((0, 1 << 64),)

    def forget(self) -> None:
        """Drop every record (tests)."""
        self._last.clear()


#: the one record every generated target's calls share: any gdngen launch may precede any other
STREAM_WRITES = StreamWrites()
