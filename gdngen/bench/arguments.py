"""Argument values the benches' command lines share."""

from __future__ import annotations

import argparse
from pathlib import Path


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


def report_arguments(parser: argparse.ArgumentParser, report: str) -> None:
    """``--target``, ``--out`` and ``--tables`` of a bench that writes ``<report>.json`` and
    ``<report>.md`` into ``--out``, or (``--tables``) joins the ``<report>.json`` of several runs
    into one report there, timing nothing."""
    parser.add_argument(
        "--target", default="h200", help="the generated target (generated.<target>)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help=f"folder for {report}.json and {report}.md"
    )
    parser.add_argument(
        "--tables", type=Path, nargs="+", default=None, metavar=f"{report.upper()}_JSON",
        help=f"time nothing: join the {report}.json of several runs (e.g. one per state dtype) "
        "into one report in --out",
    )  # fmt: skip
