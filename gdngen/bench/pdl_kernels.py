"""A producer and a consumer kernel for a decode layer's chain, with and without programmatic
dependent launch (docs/design.md, "Programmatic dependent launch"): what surrounds gdn_decode in
an engine, made small (gdngen.bench.pdl_layer times the chain; tests/gpu/test_pdl_gpu.py checks
that a PDL call reads nothing early).

- ``produce(buffer, step, spin, launch_pdl)`` writes a new pattern into a flat buffer (q, k, v,
  a, b, z or the conv's input, as views of it): element i of step s is
  ``((i * 37 + s * 101) % 257 - 128) / 128``, exact in bf16 and fp16 (:func:`pattern` is the
  same on the host). It reads the step from ``step[0]``; ``step[1]`` must hold 0. It releases the grid after it at its
  start (after its own wait), then spends ``spin`` dependent integer steps a thread before
  writing: a dependent that read its inputs before its wait would read the last step's. Its
  CTAs fit in one wave, so that the whole buffer is written after the dependent started.
- ``consume(output, history, step, launch_pdl)`` copies a flat output into row ``step[0]`` of
  ``history``, after its wait.
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32

THREADS = 256
#: the producer's CTAs at most: two an SM of an H100, so that all are resident at once
MAX_BLOCKS = 264

_compiled: dict[tuple, object] = {}


def pattern(size: int, step: int, dtype: torch.dtype, device) -> torch.Tensor:
    """What ``produce`` writes at step ``step``, made on the host's side with torch."""
    index = torch.arange(size, dtype=torch.int64, device=device)
    return (((index * 37 + step * 101) % 257 - 128).to(torch.float32) / 128).to(dtype)


def _kernels():
    @cute.kernel
    def produce_kernel(buffer: cute.Tensor, step: cute.Tensor, spin: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        blocks, _, _ = cute.arch.grid_dim()
        # The step was written by the kernel before this one; the grid after this one may start
        # now, and must wait for this one before it reads the buffer. (Launched without the PDL
        # attribute, both instructions do nothing.)
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        s = Int32(step[0])
        delay = Int32(tidx)
        for _ in cutlass.range(spin, unroll=1):
            delay = delay * Int32(1103515245) + Int32(12345)
        # step[1] holds 0, which the compiler cannot know: the stores' addresses depend on the
        # spin, so it is neither dropped nor passed by the stores.
        first = block * THREADS + tidx + delay * Int32(step[1])
        for i in cutlass.range(first, buffer.shape[0], blocks * THREADS, unroll=1):
            n = (i * 37 + s * 101) % 257 - 128
            buffer[i] = (cutlass.Float32(n) / cutlass.Float32(128.0)).to(buffer.element_type)

    @cute.kernel
    def consume_kernel(output: cute.Tensor, history: cute.Tensor, step: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        i = block * THREADS + tidx
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        if i < output.shape[0]:
            history[Int32(step[0]), i] = output[i]

    @cute.jit
    def produce(
        buffer: cute.Tensor,
        step: cute.Tensor,
        spin: Int32,
        launch_pdl: Int32,
        stream,
    ):
        # One wave at most, every CTA striding over the buffer: all of them spin at once, so
        # that no part of the buffer is written before the grid after this one has started.
        blocks = cutlass.min((buffer.shape[0] + THREADS - 1) // THREADS, MAX_BLOCKS)
        produce_kernel(buffer, step, spin).launch(
            grid=(blocks, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=launch_pdl
        )

    @cute.jit
    def consume(
        output: cute.Tensor,
        history: cute.Tensor,
        step: cute.Tensor,
        launch_pdl: Int32,
        stream,
    ):
        blocks = (output.shape[0] + THREADS - 1) // THREADS
        consume_kernel(output, history, step).launch(
            grid=(blocks, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=launch_pdl
        )

    return produce, consume


def _compile(kind: str, dtype: torch.dtype, arch: "str | None" = None):
    key = (kind, dtype, arch)
    if key not in _compiled:
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        element = {
            torch.bfloat16: cutlass.BFloat16,
            torch.float16: cutlass.Float16,
            torch.float32: cutlass.Float32,
        }[dtype]
        produce, consume = _kernels()
        flat = make_fake_compact_tensor(element, (cute.sym_int64(symbol="n"),), assumed_align=2)
        step = make_fake_compact_tensor(cutlass.Int32, (2,), assumed_align=4)
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        if arch is None:
            major, minor = torch.cuda.get_device_capability()
            arch = f"sm_{major}{minor}a"
        options = f"--enable-tvm-ffi --gpu-arch={arch}"
        if kind == "produce":
            compiled = cute.compile(
                produce, flat, step, cutlass.Int32(0), cutlass.Int32(0), stream, options=options
            )
        else:
            history = make_fake_compact_tensor(
                element,
                (cute.sym_int64(symbol="rows"), cute.sym_int64(symbol="n")),
                stride_order=(1, 0),
                assumed_align=2,
            )
            compiled = cute.compile(
                consume, flat, history, step, cutlass.Int32(0), stream, options=options
            )
        _compiled[key] = compiled
    return _compiled[key]


def produce(buffer: torch.Tensor, step: torch.Tensor, *, spin: int = 0, pdl: bool = True):
    """Launch the producer on the current stream: ``buffer`` flat, ``step`` int32 [2] holding
    the step and 0."""
    _compile("produce", buffer.dtype)(buffer, step, spin, int(pdl))


def consume(output: torch.Tensor, history: torch.Tensor, step: torch.Tensor, *, pdl: bool = True):
    """Launch the consumer: ``output`` flat, ``history`` [rows, output.numel()]."""
    _compile("consume", output.dtype)(output, history, step, int(pdl))
