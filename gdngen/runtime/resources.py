"""What a compiled kernel costs in registers, stack and spills, read from ptxas.

CI compiles every generated kernel for its own SM target (no GPU needed) and checks these. The
PTX comes from the CuTe-DSL compile; ``ptxas -v`` is taken from the nvidia-cuda-nvcc wheel (a
test dependency) or, failing that, from PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from .compile import CompileKey, compile_kernel


@dataclass(frozen=True)
class Resources:
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    ptx_lines: int = 0
    #: wide global loads (8 or 16 bytes in one instruction, see WIDE) in the PTX
    vector_loads: int = 0
    #: packed fp32x2 FMAs/multiplies in the PTX (sm_100a)
    packed_fp32x2: int = 0
    #: vector global loads and stores by cache operator, e.g. {"ld.cs": 8, "st.cs": 8}; plain
    #: ones (no operator: .ca loads, .wb stores) are not listed
    cache_ops: tuple[tuple[str, int], ...] = ()


#: what makes a global access wide (8 or 16 bytes in one instruction): a vector (.v2/.v4) or a
#: 64/128-bit scalar. The back end picks the spelling per target: an 8-byte bf16 state load is
#: ld.global.v2.b32 for sm_90a and ld.global.b64 for sm_120a. (An int64 slot load is wide too:
#: a handful per kernel, next to the state tile's ilp or vec loads per lane.)
WIDE = r"(?:v[248]\.|b64\b|b128\b)"


def find_ptxas() -> str:
    try:
        import nvidia.cuda_nvcc  # the nvidia-cuda-nvcc-cu12 wheel

        for root in nvidia.cuda_nvcc.__path__:
            candidate = Path(root) / "bin" / "ptxas"
            if candidate.is_file():
                return str(candidate)
    except ImportError:
        pass
    found = shutil.which("ptxas")
    if found:
        return found
    raise FileNotFoundError(
        "ptxas not found: install the test extra (pip install -e .[test]) or a CUDA toolkit"
    )


def parse_ptxas(report: str) -> Resources:
    def number(pattern: str) -> int:
        match = re.search(pattern, report)
        if match is None:
            raise ValueError(f"ptxas -v report has no {pattern!r}:\n{report}")
        return int(match.group(1))

    return Resources(
        registers=number(r"Used (\d+) registers"),
        stack_bytes=number(r"(\d+) bytes stack frame"),
        spill_store_bytes=number(r"(\d+) bytes spill stores"),
        spill_load_bytes=number(r"(\d+) bytes spill loads"),
    )


def kernel_resources(module: ModuleType, key: CompileKey) -> Resources:
    """Compile ``module`` for ``key`` (key.arch is the SM target) and read ptxas's report."""
    with tempfile.TemporaryDirectory(prefix="gdngen-ptx-") as tmp:
        compile_kernel(module, key, dump_dir=Path(tmp))
        ptx_files = sorted(Path(tmp).glob("*.ptx"))
        if len(ptx_files) != 1:
            raise RuntimeError(f"expected one PTX file from the compile, found {ptx_files}")
        ptx = ptx_files[0]
        run = subprocess.run(
            [find_ptxas(), f"-arch={key.arch}", "-v", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise RuntimeError(f"ptxas failed for {module.NAME}:\n{run.stderr}")
        resources = parse_ptxas(run.stderr + run.stdout)
        text = ptx.read_text()
    return replace(
        resources,
        ptx_lines=len(text.splitlines()),
        vector_loads=len(re.findall(rf"ld\.global(?:\.\w+)*?\.{WIDE}", text)),
        packed_fp32x2=len(re.findall(r"\b(?:fma|mul)\.\w+\.f32x2\b", text)),
        cache_ops=_cache_ops(text),
    )


def _cache_ops(ptx: str) -> tuple[tuple[str, int], ...]:
    """Vector global accesses that carry a cache operator, counted by kind and operator."""
    found = re.findall(rf"\b(ld|st)\.global\.(ca|cg|cs|lu|wb|wt)\.{WIDE}", ptx)
    counts: dict[str, int] = {}
    for op, mode in found:
        counts[f"{op}.{mode}"] = counts.get(f"{op}.{mode}", 0) + 1
    return tuple(sorted(counts.items()))
