"""Make the small archive of vLLM's source that the core bench's vLLM chain and the GPU test of
the fused MTP adapter load (gdngen.measure.vllm_source; docs/design.md, "Measuring"):

    python tools/vllm_bundle.py vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl vllm-gdn.tar.xz

It holds vLLM's Triton kernels of the GDN decode chain, the Triton port of its fused MTP op and
the few modules they import, read from the wheel (no install, no GPU); the wheel's own files,
never committed. On the GPU machine:

    python -m gdngen.bench.core --vllm-src vllm-gdn.tar.xz ...
    python -m gdngen.bench.mtp --vllm-src vllm-gdn.tar.xz --out OUT ...
    GDNGEN_VLLM_SRC=$PWD/vllm-gdn.tar.xz python -m pytest -q tests/gpu/test_vllm_mtp_gpu.py

(or unpack it with ``tar -xJf`` and pass the folder, or set ``GDNGEN_VLLM_SRC``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gdngen.measure.vllm_source import write_bundle  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="tools/vllm_bundle.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("wheel", type=Path, help="a vLLM wheel (.whl)")
    parser.add_argument("out", type=Path, help="the archive to write (.tar.xz)")
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        parser.error(f"wheel: expected a vLLM .whl file; {args.wheel} is none")
    if not args.out.name.endswith(".tar.xz"):
        parser.error(f"out: expected a path ending in .tar.xz; got {args.out}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    manifest = write_bundle(args.wheel, args.out)
    size = args.out.stat().st_size
    print(f"{args.out}: vLLM {manifest['vllm_version']}, {len(manifest['files'])} files, "
          f"{size / 1024:.0f} KiB")  # fmt: skip


if __name__ == "__main__":
    main()
