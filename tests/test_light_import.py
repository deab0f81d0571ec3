"""Importing a generated target stays light (docs/design.md, "Architecture").

An engine imports ``generated.<target>`` in every worker process it starts; the import needs the
runtime and torch. The spec model (pydantic), the templates (jinja2), the formatter (black) and
YAML serve ``gdngen emit``, ``tune`` and ``build`` only; CuTe DSL is imported by a kernel's JIT
compile and TVM-FFI by the first kernel a process loads, never by the import.
"""

import json
import os
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from tests.spec_helpers import GENERATED, ROOT

#: what no process that only calls kernels may import, loading them included (importing any
#: module of a package imports the package)
GENERATOR = ("gdngen.spec", "pydantic", "jinja2", "black", "yaml", "cutlass")
#: what no generated target's import may load: the generator, and TVM-FFI until a kernel loads
HEAVY = GENERATOR + ("tvm_ffi",)
TARGETS = sorted(module.name for module in pkgutil.iter_modules([str(GENERATED)]) if module.ispkg)


def test_every_emitted_target_is_checked():
    assert {"h200", "b200", "b300", "rtx_blackwell", "dgx_spark"} <= set(TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_importing_a_target_imports_no_heavy_package(target):
    code = textwrap.dedent(f"""
        import json, sys
        import generated.{target}
        print(json.dumps([name for name in {HEAVY!r} if name in sys.modules]))
        """)
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []
