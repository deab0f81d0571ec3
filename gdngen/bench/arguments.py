"""Argument values the benches' command lines share."""

from __future__ import annotations

import argparse


def comma_ints(name: str, text: str) -> list[int]:
    """``"1,4,16"`` as ``[1, 4, 16]``; for ``type=functools.partial(comma_ints, "--batches")``, so
    that a bad value is named in the parser's error."""
    try:
        return [int(word) for word in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{name}: expected comma-separated integers; got {text!r}"
        ) from None


def comma_words(text: str) -> list[str]:
    """``"bf16,fp32"`` as ``["bf16", "fp32"]``."""
    return [word for word in text.split(",") if word]
