"""Reading a spec file: YAML in, a validated :class:`Spec` out, or a :class:`SpecError` that names
the file, the field and the reason."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from gdngen.terms import sm_suffix

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
        # extra_forbidden from a pydantic model, unexpected_keyword_argument from a record
        # (gdngen.geometry, gdngen.dispatch)
        if item["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            message = "unknown key (not a field of this section)"
        elif item["type"] == "missing":
            message = "required field is missing"
        lines.append(f"  {field}: {message}")
    return "\n".join(lines)


def _mapping(text: str, spec_path: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{spec_path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(
            f"{spec_path}: expected a mapping at the top level, got {type(data).__name__}"
        )
    return data


def _extended(data: dict, spec_path: str, chain: tuple[Path, ...] = ()) -> dict:
    """``extends: other.yaml`` (relative to this spec): start from that spec's sections; every
    section this one names replaces the other's whole (no merging inside a section), so a
    reader sees exactly what changed. A target for a second SM with the same knob points is a
    few lines: target, sm, description and what differs."""
    parent_name = data.pop("extends", None)
    if parent_name is None:
        return data
    if not isinstance(parent_name, str):
        raise SpecError(
            f"{spec_path}: extends: expected the path of a spec file, got {parent_name!r}"
        )
    parent_path = Path(spec_path).parent / parent_name
    here = Path(spec_path).resolve()
    if parent_path.resolve() in chain + (here,):
        raise SpecError(f"{spec_path}: extends: {parent_name} leads back to this spec (a cycle)")
    try:
        parent_text = parent_path.read_text()
    except OSError as exc:
        raise SpecError(
            f"{spec_path}: extends: cannot read {parent_path}: {exc.strerror}"
        ) from None
    parent = _extended(_mapping(parent_text, str(parent_path)), str(parent_path), chain + (here,))
    merged = {**parent, **data}
    if "dispatch" not in data and isinstance(parent.get("dispatch"), list):
        # Inherited rules name the parent's kernels; on another SM the same knob points carry
        # this spec's SM in their names.
        old, new = sm_suffix(str(parent.get("sm"))), sm_suffix(str(merged.get("sm")))
        merged["dispatch"] = [
            {**rule, "use": _renamed(rule.get("use"), old, new)} if isinstance(rule, dict) else rule
            for rule in parent["dispatch"]
        ]
    return merged


def _renamed(name, old_suffix: str, new_suffix: str):
    if isinstance(name, str) and name.endswith("_" + old_suffix):
        return name.removesuffix(old_suffix) + new_suffix
    return name


def parse_spec(text: str, spec_path: str = "<spec>") -> Spec:
    data = _mapping(text, spec_path)
    parent_name = data.get("extends")
    data = _extended(data, spec_path)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_describe(spec_path, data, exc)) from None
    if parent_name is not None:
        # _extended has read the chain and refused cycles; the emitter needs the ancestors
        # themselves, to reuse their kernel modules.
        parent_path = str(Path(spec_path).parent / parent_name)
        parent = load_spec(parent_path)
        spec._ancestors = ((parent, parent_path),) + parent.ancestors
    return spec


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
