"""Compile one h200 variant for sm_90a on the CPU in three call forms at HV 64 (the dense
positional form, vLLM's spec form, and the spec form with dense rows), print ptxas's register and
spill report, and write each form's PTX and SASS to OUT_DIR (default /tmp/sass).

    python sass.py VARIANT T [STATE_DTYPE]      (from the repository root)

NVDISASM names the disassembler (default: `nvdisasm` on PATH; NVIDIA's nvidia-cuda-nvdisasm
wheel has one).
"""

import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.resources import find_ptxas

variant, T = sys.argv[1], int(sys.argv[2])
state_dtype = sys.argv[3] if len(sys.argv) > 3 else "bf16"
out_dir = Path(os.environ.get("OUT_DIR", "/tmp/sass"))
out_dir.mkdir(parents=True, exist_ok=True)
base = dict(
    tokens=T, H=16, HV=64, K=128, V=128, io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32",
    state_dtype=state_dtype, index_dtype="int32", separate_write_slots=False, use_qk_l2norm=True,
    null_slot=0, write_final_state=False,
)  # fmt: skip
spec = dict(per_token_slots=True, num_accepted=True, exact_slot_table=True)
forms = {
    "dense": dict(cache=True),
    "spec": dict(cache=False, cu_seqlens_dtype="int32", uniform_rows=True, **spec),
    "specdense": dict(cache=False, **spec),
}
module = importlib.import_module(f"generated.h200.kernels.{variant}")
for name, form in forms.items():
    key = CompileKey(variant=variant, arch="sm_90a", **base, **form)
    work = Path(tempfile.mkdtemp(prefix=f"sass-{name}-"))
    compile_kernel(module, key, dump_dir=work)
    ptx = next(work.glob("*.ptx"))
    cubin = work / "k.cubin"
    report = subprocess.run(
        [find_ptxas(), "-arch=sm_90a", "-v", str(ptx), "-o", str(cubin)],
        capture_output=True,
        text=True,
    )
    lines = (report.stderr + report.stdout).splitlines()
    print(name, [line.strip() for line in lines if "registers" in line or "spill" in line])
    sass = subprocess.run(
        [os.environ.get("NVDISASM", "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True
    ).stdout
    (out_dir / f"{name}-{variant}-{T}.sass").write_text(sass)
    (out_dir / f"{name}-{variant}-{T}.ptx").write_text(ptx.read_text())
