"""Reading a spec file: YAML in, a validated :class:`Spec` out, or a :class:`SpecError` that names
the file, the field and the reason."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from .model import Spec


class SpecError(ValueError):
    """A spec that cannot be used; the message names the file, the field and the reason."""


def _field_path(location: tuple) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.startswith("function-after") or part.startswith("function-before"):
            continue
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def _describe(spec_path: str, data: object, error: ValidationError) -> str:
    lines = [f"{spec_path}: invalid spec ({error.error_count()} problem(s))"]
    for item in error.errors(include_url=False):
        field = _field_path(item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (not a field of this section)"
        elif item["type"] == "missing":
            message = "required field is missing"
        lines.append(f"  {field}: {message}")
    return "\n".join(lines)


def parse_spec(text: str, spec_path: str = "<spec>") -> Spec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{spec_path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{spec_path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_describe(spec_path, data, exc)) from None


def load_spec(path: str | Path) -> Spec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec: {exc.strerror}") from None
    return parse_spec(text, str(path))


def spec_sha256(spec: Spec) -> str:
    """Hash of the spec's meaning (not its formatting or comments)."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
