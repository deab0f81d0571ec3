"""Write the PTX of a target's generated kernels for a few fixed compile keys, one file each.

A change meant to leave the kernels alone (a template restructuring, a helper moved) is proven
by snapshotting both trees and diffing the folders:

    PYTHONPATH=$PWD python tools/ptx_snapshot.py specs/h200.yaml /tmp/ptx-before --jobs 16
    ... change, re-emit ...
    PYTHONPATH=$PWD python tools/ptx_snapshot.py specs/h200.yaml /tmp/ptx-after --jobs 16
    diff -r /tmp/ptx-before /tmp/ptx-after

The files are OUT/<target>/<variant>/<key>.ptx. Compiling needs no GPU (fake tensors,
gdngen.runtime.compile); one compile takes about a second on one core. ``--variants`` takes
shell patterns (``'kl_bf16_*'``) to snapshot a subset; ``--keys`` names a subset of KEYS.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import shutil
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gdngen.runtime.compile import CompileKey, compile_kernel  # noqa: E402
from gdngen.spec import load_spec  # noqa: E402
from gdngen.terms import PORTABLE_CLUSTER, kernel_serves_head_dims  # noqa: E402
from gdngen.runtime.kernel_table import load_kernel

#: the compile keys, by name: the call forms whose code differs most (docs/design.md, "Call
#: forms"); "spec_uniform" is the spec form with rows placed at n * T and an exact table.
#: "fused_*" add the conv1d prologue and the gated RMSNorm epilogue (stepwise variants in one pass; the
#: norm only where a head's CTAs fit one portable cluster). "*_pdl" launch with programmatic
#: dependent launch, "verify_strided" takes a strided pool. "recovery" is FlashInfer's state
#: recovery, each row's boundary from accepted_steps, with write slots.
KEYS = (
    "plain", "verify", "spec", "spec_uniform", "fused_spec", "fused_update", "plain_pdl",
    "fused_update_pdl", "verify_strided", "recovery",
)  # fmt: skip


def compile_key(name: str, variant: str, knobs, info, module) -> CompileKey | None:
    """The key ``name`` for one variant, on the largest geometry it serves; None where the
    variant has no such form."""
    served = [g for g in info.geometries if kernel_serves_head_dims(module, g.K, g.V)]
    geometry = max(served, key=lambda g: (g.HV, g.V))
    plain = CompileKey(
        variant=variant, arch=info.sm, tokens=1, H=geometry.H, HV=geometry.HV, K=geometry.K,
        V=geometry.V, io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32",
        state_dtype=knobs.state_dtype, index_dtype=None, separate_write_slots=False,
        cache=False, write_final_state=True, use_qk_l2norm=True,
    )  # fmt: skip
    # vLLM's speculative form: packed sequences, a per-token slot table read at
    # num_accepted_tokens, slot 0 the null block
    spec = replace(
        plain, tokens=4, index_dtype="int32", write_final_state=False, null_slot=0,
        cu_seqlens_dtype="int32", per_token_slots=True, num_accepted=True,
    )  # fmt: skip
    if name == "plain":
        return plain
    if name == "verify":  # a pool, the verify cache, no final write
        return replace(
            plain, tokens=info.max_tokens, index_dtype="int64", separate_write_slots=True,
            cache=True, write_final_state=False,
        )  # fmt: skip
    if name == "spec":
        return spec
    if name == "spec_uniform":  # the caller's uniform_seqlen, a table exactly T wide
        return replace(spec, uniform_rows=True, exact_slot_table=True)
    if name == "plain_pdl":  # programmatic dependent launch
        return replace(plain, pdl=True)
    if name == "verify_strided":  # the verify form on a strided pool (FlashInfer's)
        return replace(compile_key("verify", variant, knobs, info, module), strided_state=True)
    if name == "recovery":
        return replace(
            plain, tokens=4, index_dtype="int32", separate_write_slots=True,
            accepted_steps_dtype="int32",
        )  # fmt: skip
    if knobs.solve != "stepwise" or knobs.row_passes > 1:  # no conv prologue or norm epilogue
        return None
    norm = geometry.V // knobs.tile_v <= PORTABLE_CLUSTER
    if name == "fused_spec":
        return replace(
            spec, conv_width=4, conv_bias=True, conv_activation="silu",
            norm_activation="silu" if norm else None, norm_weight_dtype="bf16" if norm else None,
        )  # fmt: skip
    if name in ("fused_update", "fused_update_pdl"):  # one token, int32 slots of a pool
        return replace(
            plain, index_dtype="int32", conv_width=3, conv_activation="identity",
            norm_activation="sigmoid" if norm else None, norm_weight_dtype="fp32" if norm else None,
            pdl=name == "fused_update_pdl",
        )  # fmt: skip
    raise ValueError(f"unknown key {name!r}; expected one of {KEYS}")


def snapshot_variant(spec_path: str, variant: str, keys: tuple[str, ...], out: str) -> str:
    """Compile one variant for each key, writing out/<variant>/<key>.ptx; a line saying what."""
    spec = load_spec(spec_path)
    target = importlib.import_module(f"generated.{spec.target}")
    module = load_kernel(f"generated.{spec.target}.kernels.{variant}")
    knobs = spec.variants_by_name[variant]
    folder = Path(out) / variant
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in keys:
        key = compile_key(name, variant, knobs, target.INFO, module)
        if key is None:
            continue
        with tempfile.TemporaryDirectory(prefix="gdngen-ptx-") as tmp:
            compile_kernel(module, key, dump_dir=Path(tmp))
            (ptx,) = Path(tmp).glob("*.ptx")
            shutil.copyfile(ptx, folder / f"{name}.ptx")
        written.append(name)
    return f"{variant}: {' '.join(written)}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="the target's spec, e.g. specs/h200.yaml")
    parser.add_argument("out", help="folder to write <target>/<variant>/<key>.ptx into")
    parser.add_argument("--variants", nargs="*", default=["*"], help="name patterns (default all)")
    parser.add_argument("--keys", default=",".join(KEYS), help=f"a subset of {','.join(KEYS)}")
    parser.add_argument("--jobs", type=int, default=1, help="compiles at once (processes)")
    args = parser.parse_args(argv)

    spec = load_spec(args.spec)
    keys = tuple(args.keys.split(","))
    unknown = set(keys) - set(KEYS)
    if unknown:
        parser.error(f"unknown keys {sorted(unknown)}; expected a subset of {KEYS}")
    variants = [
        name
        for name in spec.variants_by_name
        if any(fnmatch.fnmatch(name, p) for p in args.variants)
    ]
    out = str(Path(args.out) / spec.target)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        jobs = [pool.submit(snapshot_variant, args.spec, v, keys, out) for v in variants]
        for job in jobs:
            print(job.result(), flush=True)


if __name__ == "__main__":
    main()
