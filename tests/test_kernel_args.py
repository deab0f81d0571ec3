"""The call's arguments are declared once (gdngen.runtime.kernel_args): the places that cannot
derive their lists from the declaration at run time spell them in its order."""

import ast
import inspect

from gdngen.runtime.checks import check_call
from gdngen.runtime.kernel_args import (
    CHECKED,
    KERNEL_ARGS,
    KEYWORDS,
    LAUNCH_ONLY_ARGS,
    RUN_TIME_ARGS,
)
from gdngen.runtime.launcher import DecodeCall
from tests.spec_helpers import GENERATED, ROOT

DECLARED = [(arg.name, arg.annotation or None) for arg in KERNEL_ARGS]


def _parameters(function: ast.FunctionDef) -> list[tuple[str, str | None]]:
    return [
        (arg.arg, ast.unparse(arg.annotation) if arg.annotation else None)
        for arg in function.args.args
    ]


def _function(path, name: str) -> ast.FunctionDef:
    return next(
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == name
    )


def test_launch_takes_the_declared_arguments_and_passes_them_on_in_order():
    """CuTe DSL reads launch's parameters from its source: they are spelled there."""
    launch = _function(ROOT / "gdngen/device/launch.py", "launch")
    launch_only = [(arg.name, arg.annotation) for arg in LAUNCH_ONLY_ARGS]
    assert _parameters(launch) == DECLARED + launch_only + [("stream", None)]
    call = next(
        node.value
        for node in ast.walk(launch)
        if isinstance(node, ast.Assign) and ast.unparse(node.value).startswith("decode_kernel(")
    )
    assert [ast.unparse(arg) for arg in call.args] == [name for name, _ in DECLARED]


def test_every_emitted_kernel_takes_the_declared_arguments():
    """Every kernel body (one per code shape) defines decode_kernel with the declared
    parameters; the variants' modules only call a body."""
    bodies = sorted(GENERATED.glob("*/bodies/*.py"))
    bodies = [path for path in bodies if path.name != "__init__.py"]
    assert bodies, "no kernel body emitted"
    for path in bodies:
        assert _parameters(_function(path, "decode_kernel")) == DECLARED, path


def test_the_call_signature_is_the_declared_keywords():
    parameters = list(inspect.signature(DecodeCall.__call__).parameters.values())[1:]
    assert [(p.name, p.default) for p in parameters] == [(k.name, k.default) for k in KEYWORDS]
    assert [p.kind == p.POSITIONAL_OR_KEYWORD for p in parameters] == [
        k.positional for k in KEYWORDS
    ]
    assert DecodeCall.CHECKED == CHECKED


def test_check_call_takes_the_checked_keywords_with_their_defaults():
    parameters = list(inspect.signature(check_call).parameters.values())[1:]
    checked = {name: default for name, default in CHECKED.items() if name != "check_indices"}
    assert [p.name for p in parameters] == list(checked)
    for p in parameters:
        assert p.default is p.empty or p.default == checked[p.name], p.name


def test_options_are_the_constexpr_parameters():
    """What a launch passes (RUN_TIME_ARGS) is what the kernel does not compile in."""
    for arg in KERNEL_ARGS:
        assert arg.annotation.startswith("Constexpr") == arg.compile_time, arg.name
    assert len(RUN_TIME_ARGS) == sum(not arg.compile_time for arg in KERNEL_ARGS) + len(
        LAUNCH_ONLY_ARGS
    )
