"""Jinja rendering and black formatting of planned files."""

from __future__ import annotations

import functools

import black
import jinja2

from .plan import TEMPLATE_DIR, PlannedFile

BLACK_MODE = black.Mode(line_length=100, target_versions={black.TargetVersion.PY310})


def _pytuple(value: object) -> str:
    """A Python tuple literal of a list/tuple (nested lists become tuples)."""

    def convert(item: object) -> object:
        if isinstance(item, (list, tuple)):
            return tuple(convert(x) for x in item)
        return item

    return repr(convert(value))


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pytuple"] = _pytuple
    return env


class RenderError(RuntimeError):
    """A template failed to render or produced code black cannot parse."""


def render(planned: PlannedFile) -> str:
    """The final text of one file: rendered, then formatted by black."""
    try:
        text = environment().get_template(planned.template).render(**planned.context)
    except jinja2.TemplateError as exc:
        raise RenderError(f"{planned.template} -> {planned.relpath}: {exc}") from exc
    try:
        return black.format_str(text, mode=BLACK_MODE)
    except black.InvalidInput as exc:
        numbered = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(text.splitlines()))
        raise RenderError(
            f"{planned.template} -> {planned.relpath}: emitted code does not parse: {exc}\n{numbered}"
        ) from exc
