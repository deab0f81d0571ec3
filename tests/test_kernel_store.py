"""Compiled kernels on disk without a GPU: cache keys, atomic and concurrent writes, corrupt,
foreign and stale entries, loading without the compiler, the build and cache commands, the
signature the call path keys on, and warm-up (docs/design.md, "Architecture")."""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

import generated.h200 as h200
from gdngen.runtime import kernel_dir, store
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.forms import reachable_variants
from gdngen.runtime.kernel_dir import KernelDir, KernelDirWarning, entry_name, fingerprint
from gdngen.runtime.kernel_table import kernel_content_sha256, load_kernel
from gdngen.runtime.launcher import call_key
from tests.spec_helpers import ROOT
from tests.test_light_import import GENERATOR

VARIANT = "kl_bf16_tv16_ilp4_vec8_tpg16_sm90"
MODULE = f"generated.h200.kernels.{VARIANT}"
KEY = CompileKey(
    variant=VARIANT, arch="sm_90a", tokens=1, H=16, HV=32, K=128, V=128, io_dtype="bf16",
    gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype="bf16", index_dtype="int32",
    separate_write_slots=False, cache=False, write_final_state=True, use_qk_l2norm=True,
)  # fmt: skip
OTHER_VALUES = dict(
    variant="kl_bf16_tv32_ilp4_vec8_tpg16_sm90", arch="sm_100a", tokens=2, H=8, HV=64, K=64,
    V=256, io_dtype="fp16", gate_dtype="fp32", dt_bias_dtype="bf16", state_dtype="fp32",
    index_dtype="int64", separate_write_slots=True, cache=True, write_final_state=False,
    use_qk_l2norm=False, null_slot=0, cu_seqlens_dtype="int32", per_token_slots=True,
    num_accepted=True, cache_rows=True, uniform_rows=True, exact_slot_table=True,
    norm_activation="sigmoid", norm_weight_dtype="fp32",
    conv_width=4, conv_bias=True, conv_activation="identity", pdl=True,
    strided_state=True, accepted_steps_dtype="int32", recovery_steps=2, conv_channels_last=True,
)  # fmt: skip


def _python(code: str, env: dict, cwd=ROOT) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, returned parsed."""
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_compile_time_input_changes_the_entry():
    assert set(OTHER_VALUES) == {f.name for f in dataclasses.fields(CompileKey)}
    base = entry_name(fingerprint(KEY, "a" * 16))
    for name, value in OTHER_VALUES.items():
        changed = dataclasses.replace(KEY, **{name: value})
        assert entry_name(fingerprint(changed, "a" * 16)) != base, name
    assert entry_name(fingerprint(KEY, "b" * 16)) != base  # other generated code


def test_the_toolchain_versions_change_the_entry(monkeypatch):
    base = entry_name(fingerprint(KEY, "a" * 16))
    monkeypatch.setattr(
        kernel_dir,
        "toolchain_versions",
        lambda: {"nvidia-cutlass-dsl": "9.9", "apache-tvm-ffi": "1"},
    )
    assert entry_name(fingerprint(KEY, "a" * 16)) != base


def test_an_edited_device_helper_changes_the_entry(monkeypatch, tmp_path):
    base = entry_name(fingerprint(KEY, "a" * 16))
    helpers = tmp_path / "device"
    shutil.copytree(kernel_dir.DEVICE_HELPERS, helpers)
    monkeypatch.setattr(kernel_dir, "DEVICE_HELPERS", helpers)
    kernel_dir.device_helpers_sha256.cache_clear()
    try:
        assert entry_name(fingerprint(KEY, "a" * 16)) == base  # same sources, same entry
        kernel_dir.device_helpers_sha256.cache_clear()
        (helpers / "norm.py").write_text((helpers / "norm.py").read_text() + "\n# edited\n")
        assert entry_name(fingerprint(KEY, "a" * 16)) != base
    finally:
        kernel_dir.device_helpers_sha256.cache_clear()


def test_a_variant_hash_is_read_without_importing_its_body():
    import generated.h200.kernels as kernels

    body_module = f"generated.h200.bodies.{kernels.KERNELS.rows[VARIANT].body.rpartition('.')[2]}"
    imported = sys.modules.pop(body_module, None)
    try:  # (then put back: other tests hold kernels built from the module as imported)
        kernel_content_sha256.cache_clear()
        digest = kernel_content_sha256(MODULE)
        assert body_module not in sys.modules
    finally:
        if imported is not None:
            sys.modules[body_module] = imported
    # its row's hash and its body's (the device code), that one from the body file's header
    row_hash, body_hash = digest.split("+")
    body = ROOT / "generated" / "h200" / "bodies" / f"{body_module.rpartition('.')[2]}.py"
    assert f"# Content sha256: {body_hash}" == body.read_text().splitlines()[2]
    row = kernels.KERNELS.rows[VARIANT]
    assert row_hash == hashlib.sha256(repr(row).encode()).hexdigest()[:16]
    # a knob of the row, or the body it names, is part of the hash
    assert repr(row) == (
        f"Row('{VARIANT}', '..bodies.kl_stepwise', TILE_V=16, ILP=4, VEC=8, THREADS_PER_GROUP=16)"
    )


@pytest.fixture(scope="module")
def compiled():
    """One real JIT compile (CPU), reused."""
    return compile_kernel(load_kernel(MODULE), KEY)


@pytest.fixture
def saved(tmp_path, compiled):
    folder = KernelDir(tmp_path / "kernels", writable=True)
    record = fingerprint(KEY, kernel_content_sha256(MODULE))
    folder.save(record, compiled)
    return folder, record


def test_a_saved_kernel_is_found_and_loaded_without_the_compiler(saved):
    folder, record = saved
    assert folder.has(record)
    assert not list(folder.path.rglob("*.tmp")) and not list(folder.path.rglob(".build-*"))
    found = _python(
        f"""
        import json, sys
        from gdngen.runtime.compile import CompileKey
        from gdngen.runtime.store import find_kernel
        found = find_kernel("{MODULE}", CompileKey(**{dataclasses.asdict(KEY)!r}))
        print(json.dumps({{"source": found.source, "type": type(found.kernel).__name__,
                          "cutlass": "cutlass" in sys.modules}}))
        """,
        {"GDNGEN_ARTIFACTS": str(folder.path), "GDNGEN_DISK_CACHE": "0"},
    )
    assert found == {"source": "artifact", "type": "Function", "cutlass": False}


def test_a_stale_artifact_is_never_loaded(saved, monkeypatch):
    folder, record = saved
    # The same key, other generated code: another entry name, so the artifact is not even found.
    stale = fingerprint(KEY, "0" * 16)
    assert folder.load(stale) is None and not folder.has(stale)
    monkeypatch.setattr(
        kernel_dir,
        "toolchain_versions",
        lambda: {"nvidia-cutlass-dsl": "0.0", "apache-tvm-ffi": "0"},
    )
    assert not folder.has(fingerprint(KEY, record["module_sha256"]))


def test_a_truncated_entry_is_ignored_with_a_warning_and_rebuilt(saved, monkeypatch):
    folder, record = saved
    library = next(folder.path.rglob("*.so"))
    library.write_bytes(library.read_bytes()[:1000])
    assert not folder.has(record)
    with pytest.warns(KernelDirWarning, match="truncated"):
        assert folder.load(record) is None
    # Through the store (this folder as the disk cache): rebuilt, and whole again.
    monkeypatch.setenv("GDNGEN_CACHE_DIR", str(folder.path))
    monkeypatch.delenv("GDNGEN_ARTIFACTS", raising=False)
    monkeypatch.setattr(store, "_kernels", {})
    monkeypatch.setattr(store, "_sources", {})
    with pytest.warns(KernelDirWarning):
        found = store.find_kernel(MODULE, KEY)
    assert found.source == "compiled" and folder.has(record)


def test_a_foreign_entry_is_ignored(saved, tmp_path):
    folder, record = saved
    other = fingerprint(dataclasses.replace(KEY, tokens=2), record["module_sha256"])
    meta = next(folder.path.rglob("*.json"))
    body = json.loads(meta.read_text())
    body["fingerprint"] = other  # an entry that holds another kernel under this one's name
    meta.write_text(json.dumps(body))
    with pytest.warns(KernelDirWarning, match="another kernel"):
        assert folder.load(record) is None


class _FakeCompiled:
    """Stands in for a compiled kernel: export_to_c writes a small real object file."""

    def export_to_c(self, path, name, export_only_tvm_ffi_symbols=True):
        source = Path(path).with_suffix(".c")
        source.write_text(
            "int gdngen_test_symbol(void) { return 42; }\n" + "/*" + "x" * 4000 + "*/\n"
        )
        subprocess.run(["cc", "-c", "-fPIC", str(source), "-o", str(path)], check=True)


def _save_fake(path: str) -> str:
    folder = KernelDir(path, writable=True)
    record = fingerprint(KEY, "f" * 16)
    with folder.locked(record):
        if not folder.has(record):
            folder.save(record, _FakeCompiled())
    return "ok"


def test_processes_writing_one_entry_at_once_leave_one_whole_entry(tmp_path):
    with ProcessPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(_save_fake, [str(tmp_path)] * 8)) == ["ok"] * 8
    folder = KernelDir(tmp_path, writable=True)
    assert folder.has(fingerprint(KEY, "f" * 16))
    assert len(list(tmp_path.rglob("*.so"))) == 1 and not list(tmp_path.rglob("*.tmp"))


def test_unlocked_concurrent_saves_are_atomic(tmp_path):
    """Even without the lock, every reader sees a whole entry: each file lands by rename."""

    def save(_):
        KernelDir(tmp_path, writable=True).save(fingerprint(KEY, "e" * 16), _FakeCompiled())

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(save, range(6)))
    assert KernelDir(tmp_path, writable=True).has(fingerprint(KEY, "e" * 16))


def test_cache_command_shows_and_clears(saved):
    folder, _ = saved
    shown = subprocess.run(
        [sys.executable, "-m", "gdngen", "cache", "--dir", str(folder.path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert shown.returncode == 0 and "1 kernels" in shown.stdout and VARIANT in shown.stdout
    cleared = subprocess.run(
        [sys.executable, "-m", "gdngen", "cache", "--dir", str(folder.path), "--clear"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert cleared.returncode == 0 and "removed 1 kernels" in cleared.stdout
    assert not list(folder.path.rglob("*.so"))


def test_clearing_a_folder_removes_kernel_entries_only(saved):
    folder, _ = saved
    (folder.path / "notes").mkdir()
    (folder.path / "notes" / "keep.json").write_text('{"mine": true}')
    (folder.path / "keep.txt").write_text("mine")
    assert folder.clear() == 1
    assert not list(folder.path.rglob("*.so"))
    assert (folder.path / "notes" / "keep.json").is_file() and (folder.path / "keep.txt").is_file()


def test_the_default_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GDNGEN_CACHE_DIR", str(tmp_path / "x"))
    assert kernel_dir.default_cache_dir() == tmp_path / "x"
    monkeypatch.delenv("GDNGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_dir.default_cache_dir() == tmp_path / "xdg" / "gdngen"


def test_reachable_variants_are_every_variant_some_batch_size_gets():
    table = h200.dispatch.TABLE
    # Each batch*heads where some rule's range starts, or the one past where it ends: from one
    # such point to the next no range starts or ends, so the first match is the same there.
    points = {1}
    for rule in table:
        points.add(rule.batch_heads.lo)
        if rule.batch_heads.hi is not None:
            points.add(rule.batch_heads.hi + 1)
    for layout, state_dtype in h200.INFO.served:
        for head in sorted({(g.K, g.V) for g in h200.INFO.geometries}):
            for tokens in (1, 3, 8):
                for verify in (False, True):
                    every = {
                        h200.select(layout=layout, state_dtype=state_dtype, tokens=tokens,
                                    batch_heads=bh, intermediate=verify, head_dims=head).use
                        for bh in points
                    }  # fmt: skip
                    found = reachable_variants(table, layout, state_dtype, tokens, verify, head)
                    assert set(found) == every and len(found) == len(set(found))


def _key(**changes):
    from gdngen.problem import Problem

    args = Problem(batch=3, HV=32, pool_size=5, cache_steps=2, seed=1).make("cpu")
    args.update(changes)
    args.setdefault("output", None)
    args.setdefault("output_state_indices", None)
    args = {k: v for k, v in args.items() if k not in ("state_layout", "backend")}
    return call_key(**args, state_layout="k_last", backend="auto")


def test_the_call_key_changes_with_what_the_kernel_does_not_check():
    """The signature a known call is recognised by: the same facts in new tensors match; every
    fact the compiled kernel's own argument checks do not cover makes a new signature."""
    from gdngen.problem import Problem

    base = _key()
    assert _key() == base  # fresh tensors, same facts
    other = Problem(batch=3, HV=32, pool_size=5, cache_steps=2, seed=1).make("cpu")
    pool = other["initial_state"]
    changed = {
        "batch (dispatch)": dict(q=other["q"][:2]),
        "value heads (dispatch)": dict(v=other["v"][:, :, :16]),
        "io dtype": dict(q=other["q"].half()),
        "gate dtype": dict(a=other["a"].float()),
        "dt_bias dtype": dict(dt_bias=other["dt_bias"].bfloat16()),
        "state dtype": dict(initial_state=pool.float()),
        "pool size": dict(initial_state=pool[:4]),
        "overlapping slots": dict(initial_state=torch.as_strided(pool, pool.shape, (1,) + pool.stride()[1:])),
        "dense state": dict(state=pool, initial_state=None),
        "index dtype": dict(initial_state_indices=other["initial_state_indices"].long()),
        "no indices": dict(initial_state_indices=None),
        "write slots": dict(output_state_indices=other["initial_state_indices"]),
        "cache steps": dict(intermediate_states_buffer=other["intermediate_states_buffer"][:, :1]),
        "no cache": dict(intermediate_states_buffer=None),
        "output given": dict(output=torch.empty(3, 1, 32, 128, dtype=torch.bfloat16)),
        "scale": dict(scale=0.5),
        "flag as int": dict(use_qk_l2norm=1),
        "flag value": dict(disable_state_update=True),
    }  # fmt: skip
    for what, change in changed.items():
        assert _key(**change) != base, what
    with pytest.raises(AttributeError):
        _key(q=[1, 2])


def test_the_call_key_holds_whether_the_conv_pool_is_16_byte_aligned():
    # The split plan's conv step moves an aligned channels-last pool in vectors
    # (gdngen.runtime.conv_step.moves_in_vectors): a misaligned one of the same shape and
    # strides must plan again, not launch the vector step (which TVM-FFI would refuse).
    held = torch.zeros(5 * 3 * 64 + 8, dtype=torch.bfloat16)

    def pool(at: int):
        return held[at : at + 5 * 3 * 64].view(5, 3, 64).transpose(1, 2)

    assert _key(conv_state=pool(0)) == _key(conv_state=pool(8))  # 16 bytes on
    assert _key(conv_state=pool(0)) != _key(conv_state=pool(1))


def _packed_key(total: int, max_seqlen, sequences: int = 1):
    from gdngen.problem import PackedProblem

    args = PackedProblem(sequences=sequences, tokens=1, HV=32, slots="row").make("cpu")
    for name in ("q", "k", "v"):
        args[name] = args[name][:, :1].expand(1, total, *args[name].shape[2:])
    for name in ("a", "b"):
        args[name] = args[name][:, :1].expand(1, total, -1)
    args.update(max_seqlen=max_seqlen, output=None, output_state_indices=None)
    args.setdefault("state", None)
    args.setdefault("intermediate_states_buffer", None)
    args = {k: v for k, v in args.items() if k not in ("state_layout", "backend")}
    return call_key(**args, state_layout="k_last", backend="auto")


def test_a_packed_call_without_max_seqlen_is_known_by_its_total():
    """Without max_seqlen a packed call's T is its total token count, up to the target's most:
    two calls of one sequence with 2 and 3 tokens need kernels of T = 2 and T = 3, so their
    signatures differ. With max_seqlen the total is the kernel's run-time business."""
    assert _packed_key(2, None) != _packed_key(3, None)
    assert _packed_key(2, None) == _packed_key(2, None)
    assert _packed_key(2, 4) == _packed_key(3, 4)
    assert _packed_key(2, 4) != _packed_key(2, 3)


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(layout="x_last"), "layout/state_dtype: target h200 serves"),
        (
            dict(geometry="qwen9"),
            r"geometry: target h200 has qwen3-next, qwen3-next-tp2, .*, head-dim-256; got 'qwen9'",
        ),
        (dict(index_dtype="int16"), "index_dtype: target h200 takes int32/int64 or None"),
        (dict(max_tokens=9), "max_tokens: expected 1..8; got 9"),
        (
            dict(modes=("decode",)),
            "modes: expected some of 'update', 'verify', 'spec', 'verify_rows'; got ('decode',)",
        ),
        (dict(null_slot=-2), "null_slot: expected an int >= -1; got -2"),
    ],
)
def test_warmup_names_a_bad_option(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        h200.warmup(**options)


MINI_SPEC = """\
target: mini
sm: sm_90a
geometries:
  - {name: g, H: 16, HV: 32, K: 128, V: 128}
features: {max_tokens: 2, index_dtypes: [int32]}
build: {modes: [update, verify], slots: [int32]}
variants:
  - {layout: k_last, state_dtype: bf16, tile_v: 16, ilp: 4, vec: 8, threads_per_group: 16}
  - {layout: k_last, state_dtype: bf16, tile_v: 64, ilp: 8, vec: 8, threads_per_group: 16}
dispatch:
  - {layout: k_last, state_dtype: bf16, tokens: [1, 2], batch_heads: [1, 512], use: kl_bf16_tv16_ilp4_vec8_tpg16_sm90}
  - {layout: k_last, state_dtype: bf16, tokens: [1, 2], batch_heads: [513, null], use: kl_bf16_tv64_ilp8_vec8_tpg16_sm90}
"""


def test_build_then_warmup_from_the_artifacts_in_a_fresh_process(tmp_path):
    """`gdngen build` on a small spec (no GPU): 2 variants x (T=1 update, T=2 update, T=2 verify)
    = 6 kernels with a manifest; a fresh process warms up from them without the compiler (nor any
    other package of the generator's), and a second build finds them all already built."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "mini.yaml").write_text(MINI_SPEC)
    # the mini target from tmp_path, gdngen from this checkout (not from wherever it is installed)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "GDNGEN_DISK_CACHE": "0"}

    def gdngen(*args):
        return subprocess.run(
            [sys.executable, "-m", "gdngen", *args], cwd=tmp_path, capture_output=True,
            text=True, env={**os.environ, **env}, timeout=900,
        )  # fmt: skip

    assert gdngen("emit", "specs/mini.yaml").returncode == 0
    built = gdngen("build", "specs/mini.yaml", "--out", "art", "--jobs", "2")
    assert built.returncode == 0, built.stderr
    manifest = json.loads((tmp_path / "art" / "MANIFEST.json").read_text())
    assert (manifest["target"], manifest["kernels"], manifest["built"]) == ("mini", 6, 6)
    assert all((tmp_path / "art" / e["library"]).is_file() for e in manifest["entries"])
    again = gdngen("build", "specs/mini.yaml", "--out", "art")
    assert again.returncode == 0 and "(0 built" in again.stdout

    warmed = _python(
        f"""
        import json, sys
        import generated.mini as mini
        summary = mini.warmup(progress=False)
        heavy = [name for name in {GENERATOR!r} if name in sys.modules]
        print(json.dumps({{"by_source": summary.by_source, "heavy": heavy}}))
        """,
        {**env, "GDNGEN_ARTIFACTS": str(tmp_path / "art")},
        cwd=tmp_path,
    )
    assert warmed == {"by_source": {"artifact": 6}, "heavy": []}  # CuTe DSL, pydantic, ...

    # generated code changed (a stale build): nothing is loaded from the old artifacts
    # (the body both variants run, as a template edit re-emits it)
    body = tmp_path / "generated/mini/bodies/kl_stepwise.py"
    body.write_text(body.read_text().replace("# Content sha256: ", "# Content sha256: 0"))
    stale = _python(
        """
        import json
        import generated.mini as mini
        print(json.dumps(mini.warmup(max_tokens=1, modes=("update",), progress=False).by_source))
        """,
        {**env, "GDNGEN_ARTIFACTS": str(tmp_path / "art")},
        cwd=tmp_path,
    )
    assert stale == {"compiled": 2}


def test_build_refuses_stale_generated_code(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "mini.yaml").write_text(MINI_SPEC)
    run = subprocess.run(
        [sys.executable, "-m", "gdngen", "build", "specs/mini.yaml"], cwd=tmp_path,
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert run.returncode == 2 and "run gdngen emit specs/mini.yaml first" in run.stderr


def test_toolchain_versions_are_the_installed_ones():
    from importlib import metadata

    assert kernel_dir.installed_version("nvidia_cutlass_dsl", "nvidia-cutlass-dsl") == (
        metadata.version("nvidia-cutlass-dsl")
    )
    assert kernel_dir.installed_version("tvm_ffi", "apache-tvm-ffi") == (
        metadata.version("apache-tvm-ffi")
    )
    assert kernel_dir.installed_version("no_such_module_here", "no-such-dist") is None


def test_an_unusable_cache_folder_falls_back_to_compiling_with_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GDNGEN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("GDNGEN_ARTIFACTS", raising=False)
    monkeypatch.setattr(store, "_kernels", {})
    monkeypatch.setattr(store, "_sources", {})
    with pytest.warns(KernelDirWarning, match="is not usable"):
        found = store.find_kernel(MODULE, KEY)
    assert found.source == "compiled"
