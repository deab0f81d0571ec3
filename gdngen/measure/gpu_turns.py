"""Turns on one GPU for several bench or tune processes.

A bench or a tune spends most of its time compiling kernels, which needs no GPU. Processes that
measure different pairs or token counts can therefore share one GPU if whatever they run on it
(drawing inputs, checking, timing) runs in turns: a timing with another process's kernels on the
GPU beside it would be wrong. A turn is an exclusive lock on a file all of them name; it ends only
after the GPU has finished the turn's work.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, ContextManager, Iterator

import torch


def _finish_gpu_work() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def gpu_turns(
    lock_path: Path | str | None, finish: Callable[[], None] = _finish_gpu_work
) -> Callable[[], ContextManager]:
    """A ``gpu_turn()`` factory: each turn holds ``lock_path`` exclusively, and calls ``finish``
    (wait for the GPU) before letting go, so no work of this turn overlaps the next one's.
    Without a lock path (a process that has the GPU to itself) a turn is a no-op."""
    if lock_path is None:
        return nullcontext

    @contextmanager
    def gpu_turn() -> Iterator[None]:
        with open(lock_path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                try:
                    finish()
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    return gpu_turn
