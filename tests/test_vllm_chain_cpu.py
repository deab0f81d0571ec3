"""The core bench's vLLM chain without a GPU: which files of a vLLM wheel its bundle takes, the
loader's answers when the source is missing, the loaded modules where Triton is installed, the
chain's torch steps against the reference, and the report's vLLM column."""

import ast
import importlib.metadata
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from gdngen.bench import core
from gdngen.bench.vllm_chain import native_gated_rmsnorm, split_heads
from gdngen.measure.summary import relative_error
from gdngen.measure.vllm_kernels import CudaPlatformStandIn, vllm_kernels
from gdngen.measure.vllm_source import (
    CONSTANTS_MODULE,
    KERNEL_MODULES,
    MANIFEST,
    STOOD_IN,
    module_closure,
    module_path,
    write_bundle,
)
from gdngen.reference import gated_rmsnorm, split_mixed_qkv
from tests.spec_helpers import ROOT

#: where the lead's machines keep a downloaded vLLM wheel; CI has none, and skips what needs it
WHEELS = sorted(Path("/tmp/vllm").glob("vllm-*.whl"))
needs_wheel = pytest.mark.skipif(not WHEELS, reason="no vLLM wheel in /tmp/vllm")


def test_no_source_is_reported_with_how_to_give_one(monkeypatch):
    monkeypatch.delenv("GDNGEN_VLLM_SRC", raising=False)
    reason = vllm_kernels(None)
    assert isinstance(reason, str)
    assert "--vllm-src" in reason and "GDNGEN_VLLM_SRC" in reason and "vllm_bundle" in reason


def test_an_absent_folder_is_reported_missing(tmp_path):
    reason = vllm_kernels(tmp_path / "absent")
    assert isinstance(reason, str) and "there is none" in reason


def test_a_folder_without_the_kernels_names_the_files_it_lacks(tmp_path):
    reason = vllm_kernels(tmp_path)
    assert isinstance(reason, str)
    for module in KERNEL_MODULES.values():
        assert module_path(module) in reason


def _fake_wheel(tmp_path, files: dict[str, str]) -> Path:
    wheel = tmp_path / "vllm-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, textwrap.dedent(text))
        zf.writestr("vllm-9.9.9.dist-info/METADATA", "Name: vllm\nVersion: 9.9.9\n")
    return wheel


def test_the_closure_follows_unconditional_top_level_imports_only(tmp_path):
    conv, recurrent, spec, norm, mtp = (module_path(m) for m in KERNEL_MODULES.values())
    files = {
        conv: """
            from vllm.platforms import current_platform
            from vllm.helpers import tool
            if current_platform.is_cpu():
                from vllm.other_platform import kernel
            def later():
                import vllm.only_when_called
            """,
        recurrent: "from .op import exp\n",
        module_path("vllm.third_party.flash_linear_attention.ops.op"): "import os\n",
        spec: """
            from vllm import envs
            try:
                import vllm.optional
            except ImportError:
                pass
            """,
        norm: "from vllm.triton_utils import triton\n",
        mtp: "from vllm.utils.platform_utils import num_compute_units\n",
        "vllm/helpers/tool.py": "x = 1\n",
        "vllm/helpers/__init__.py": "raise RuntimeError('a package __init__ is never run')\n",
        "vllm/envs.py": "",
        "vllm/optional.py": "",
        "vllm/other_platform.py": "",
        "vllm/only_when_called.py": "",
        "vllm/platforms.py": "raise RuntimeError('stood in for')\n",
        module_path(CONSTANTS_MODULE): "NULL_BLOCK_ID = 0\nPAD_SLOT_ID = -1\n",
    }
    wheel = _fake_wheel(tmp_path, files)
    with zipfile.ZipFile(wheel) as zf:
        closure = module_closure(lambda p: zf.read(p).decode() if p in zf.namelist() else None)
    assert closure == sorted(
        [*KERNEL_MODULES.values(), "vllm.third_party.flash_linear_attention.ops.op",
         "vllm.helpers.tool", "vllm.envs", "vllm.optional"]
    )  # fmt: skip
    out = tmp_path / "bundle.tar.xz"
    manifest = write_bundle(wheel, out)
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert sorted(names) == sorted([*map(module_path, closure), module_path(CONSTANTS_MODULE),
                                    MANIFEST])  # fmt: skip
    assert manifest["vllm_version"] == "9.9.9"


def test_a_wheel_without_the_kernels_is_refused(tmp_path):
    wheel = _fake_wheel(tmp_path, {"vllm/envs.py": ""})
    with pytest.raises(ValueError, match="not a vLLM wheel this serves"):
        write_bundle(wheel, tmp_path / "out.tar.xz")


@pytest.fixture(scope="module")
def real_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "vllm-gdn.tar.xz"
    manifest = write_bundle(WHEELS[-1], out)
    folder = out.parent / "src"
    with tarfile.open(out) as tar:
        tar.extractall(folder, filter="data")
    return out, manifest, folder


@needs_wheel
def test_the_real_wheel_gives_a_small_deterministic_bundle_of_parseable_modules(real_bundle):
    out, manifest, folder = real_bundle
    assert out.stat().st_size < 512 * 1024
    again = out.parent / "again.tar.xz"
    write_bundle(WHEELS[-1], again)
    assert again.read_bytes() == out.read_bytes()
    files = sorted(manifest["files"])
    for module in [*KERNEL_MODULES.values(), CONSTANTS_MODULE]:
        assert module_path(module) in files
    assert not [f for f in files if f.endswith("__init__.py")]
    assert not [m for m in STOOD_IN - {CONSTANTS_MODULE} if module_path(m) in files]
    for path in files:
        ast.parse((folder / path).read_text(), filename=path)


@needs_wheel
def test_the_real_bundle_loads_where_triton_is_installed(real_bundle):
    """In a fresh process (the loader claims the name ``vllm``): the kernels where Triton
    imports, else the reason naming Triton."""
    _, manifest, folder = real_bundle
    code = textwrap.dedent(f"""
        import json, sys
        from gdngen.measure.vllm_kernels import vllm_kernels
        kernels = vllm_kernels({str(folder)!r})
        if isinstance(kernels, str):
            print(json.dumps(dict(reason=kernels)))
        else:
            stood_in = [n for n, m in sys.modules.items() if getattr(m, "__gdngen_stand_in__", 0)]
            print(json.dumps(dict(
                version=kernels.version, null=kernels.null_block_id,
                functions=[kernels.causal_conv1d_update.__name__, kernels.packed_decode.__name__,
                           kernels.spec_decode.__name__, kernels.rmsnorm_fn.__name__,
                           kernels.mtp_decode.__name__],
                stood_in=stood_in, einops="einops" in sys.modules,
            )))
        """)  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.splitlines()[-1])
    if importlib.util.find_spec("triton") is None:
        assert answer == dict(reason="vLLM's kernels need Triton, which is not installed")
        return
    triton = importlib.metadata.version("triton")
    assert answer["version"] == f"{manifest['vllm_version']} (Triton {triton})"
    assert answer["null"] == 0
    assert answer["functions"] == [
        "causal_conv1d_update", "fused_recurrent_gated_delta_rule_packed_decode",
        "fused_sigmoid_gating_delta_rule_update", "rmsnorm_fn",
        "fused_gdn_decode_post_conv_mtp_triton",
    ]  # fmt: skip
    assert STOOD_IN <= set(answer["stood_in"])
    assert not answer["einops"] or importlib.util.find_spec("einops") is not None


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton's interpreter")
def test_the_chain_matches_the_reference_in_the_triton_interpreter(request):
    """Every call form of the chain (tests/vllm_interpret.py) against the float64 reference, on
    ``$GDNGEN_VLLM_SRC`` or the bundle of the wheel in /tmp/vllm."""
    source = os.environ.get("GDNGEN_VLLM_SRC")
    if not source:
        if not WHEELS:
            pytest.skip("no vLLM source: no wheel in /tmp/vllm, no GDNGEN_VLLM_SRC")
        source = str(request.getfixturevalue("real_bundle")[2])
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "tests.vllm_interpret", source], cwd=ROOT,
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    cases = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(cases) == 5
    for case in cases:
        assert case["output"] < 1e-5 and case["native_norm"] < 1e-5, case
        assert case["state"] < 2**-8, case  # a bf16 state's rounding
        assert case["conv_state"] is None or case["conv_state"] < 1e-6, case


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton's interpreter")
def test_the_mtp_adapter_matches_vllms_port_in_the_triton_interpreter(request):
    """vLLM's Triton port of its fused MTP op and gdngen's adapter of it (over the float64
    stand-in of gdn_decode) on vLLM's inputs (tests/vllm_mtp_interpret.py): each against the
    float64 reference, and the two against each other."""
    source = os.environ.get("GDNGEN_VLLM_SRC")
    if not source:
        if not WHEELS:
            pytest.skip("no vLLM source: no wheel in /tmp/vllm, no GDNGEN_VLLM_SRC")
        source = str(request.getfixturevalue("real_bundle")[2])
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "tests.vllm_mtp_interpret", source], cwd=ROOT,
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    cases = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(cases) == 5
    for case in cases:
        assert case["same_slots"] and case["same_untouched_rows"], case
        assert case["output"] < 1e-5, case  # fp32 outputs: the order of the sums alone
        # a bf16 state: the port's rounding toward zero (interpreter) against ours to nearest
        assert case["state"] < (2**-8 if case["case"][2] == "bf16" else 1e-6), case


def test_the_platform_stand_in_answers_as_vllm_does_without_a_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    platform = CudaPlatformStandIn()
    assert platform.is_cuda() and not platform.is_cpu() and not platform.is_rocm()
    assert platform.get_device_capability() is None
    assert not platform.is_device_capability_family(100)
    assert not platform.has_device_capability(80)


def test_the_platform_stand_in_reads_the_device_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    platform = CudaPlatformStandIn()
    assert platform.get_device_capability().to_int() == 90
    assert platform.is_device_capability_family(90) and not platform.is_device_capability_family(
        100
    )
    assert platform.has_device_capability(80) and not platform.has_device_capability((10, 0))
    assert platform.is_device_capability((9, 0)) and platform.is_arch_support_pdl()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert not platform.is_arch_support_pdl()


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_the_native_norm_is_the_reference_gated_rmsnorm(activation):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, 128, generator=gen).bfloat16()
    z = torch.randn(6, 4, 128, generator=gen).bfloat16()
    weight = (1 + 0.1 * torch.randn(128, generator=gen)).bfloat16()
    got = native_gated_rmsnorm(x, z, weight, 1e-6, activation)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    expected = gated_rmsnorm(x, z, weight, eps=1e-6, activation=activation)
    assert float((got.double() - expected).norm() / expected.norm()) < 2**-8


def test_split_heads_gives_contiguous_q_k_v_of_the_rows():
    H, K, HV, V, L = 2, 8, 4, 8, 3
    rows = torch.randn(L, 2 * H * K + HV * V + 5)[:, : 2 * H * K + HV * V]  # a strided view
    q, k, v = split_heads(rows, H, K, HV, V)
    for got, expected in zip((q, k, v), split_mixed_qkv(rows, H, K, HV, V)):
        assert got.is_contiguous() and torch.equal(got[0], expected)


def _record(batch, us):
    return dict(state_dtype="bf16", HV=32, tokens=1, batch=batch, variant="v", us=us)


def test_the_report_has_the_faster_vllm_chain_over_fused_and_counts_it_a_chain():
    env = dict(gpu="H100", vllm="0.33.0", conv_layout="channels_last", fla_steps="conv, norm")
    records = [
        _record(1, {"fused core": 10.0, "chain (gdngen)": 12.0, "chain (vllm, triton norm)": 9.0,
                    "chain (vllm, inductor norm)": 11.0, "recurrence alone": 8.0}),
        _record(4, {"fused core": 10.0, "chain (gdngen)": 12.0, "recurrence alone": 8.0}),
    ]  # fmt: skip
    text = core.markdown(records, env)
    header, rule, first, second = text.splitlines()[2:6]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[-6:] == [
        "fastest chain / fused", "vllm chain / fused", "fused / recurrence", "split / recurrence",
        "vllm chain / best plan", "best plan / floor",
    ]  # fmt: skip
    assert rule.count("---") == len(columns)
    # (the records have no geometry, so no floor)
    assert [c.strip() for c in first.strip("|").split("|")][-6:] == [
        "0.90", "0.90", "1.250", "-", "0.90", "-"
    ]  # fmt: skip
    assert [c.strip() for c in second.strip("|").split("|")][-6:] == [
        "1.20", "-", "1.250", "-", "-", "-"
    ]  # fmt: skip
    assert "vLLM chain: 0.33.0" in text
    assert "vllm chain / fused: geometric mean 0.90x over 1 cells" in text


def _check_set():
    gen = torch.Generator().manual_seed(1)
    pool = torch.randn(6, 2, 4, 4, generator=gen)
    conv_pool = torch.randn(6, 5, 3, generator=gen).transpose(1, 2)  # a channels-last view
    return dict(args=dict(initial_state=pool), conv_state=conv_pool,
                fla_cache=torch.randn(2, 3, 4, generator=gen))  # fmt: skip


def _step(slot: int, scale: float = 1.0):
    """A stand-in chain: writes the pools at ``slot`` and returns an output of the pool."""

    def run(s):
        s["args"]["initial_state"][slot] += 1.0
        s["conv_state"][slot] += 2.0
        s["fla_cache"].zero_()
        return s["args"]["initial_state"][1:3].sum(dim=-1) * scale

    return run


def test_check_vllm_passes_the_same_chain_and_restores_the_states():
    s = _check_set()
    before = dict(pool=s["args"]["initial_state"].clone(), conv=s["conv_state"].clone(),
                  fla=s["fla_cache"].clone())  # fmt: skip
    errors = core.check_vllm(s, {"chain (vllm, triton norm)": _step(2)}, _step(2), _step(2), True)
    assert errors == {"chain (vllm, triton norm)": dict(output=0.0, state=0.0, conv_state=0.0)}
    assert torch.equal(s["args"]["initial_state"], before["pool"])
    assert torch.equal(s["conv_state"], before["conv"])
    assert torch.equal(s["fla_cache"], before["fla"])


@pytest.mark.parametrize("wrong", ["slot", "output"])
def test_check_vllm_fails_a_chain_that_writes_elsewhere_or_outputs_otherwise(wrong):
    s = _check_set()
    vllm = _step(4) if wrong == "slot" else _step(2, scale=1.1)
    with pytest.raises(AssertionError, match="chain \\(vllm, inductor norm\\): its"):
        core.check_vllm(s, {"chain (vllm, inductor norm)": vllm}, _step(2), _step(2), True)


def test_relative_error_over_chunks_is_the_whole_tensors():
    gen = torch.Generator().manual_seed(2)
    expected = torch.randn(5, 7, generator=gen).t()  # strided: its flat order is the logical one
    got = expected + 0.01 * torch.randn(7, 5, generator=gen)
    whole = float((got.double() - expected.double()).norm() / expected.double().norm())
    assert relative_error(got, expected, chunk=3) == pytest.approx(whole, rel=1e-12)


def test_the_state_digest_tells_a_transposed_or_moved_state():
    gen = torch.Generator().manual_seed(3)
    pool = torch.randn(40, 2, 8, 8, generator=gen).bfloat16()
    digest = core.state_digest(pool)
    assert digest.shape == (40, 2, 8) and digest.dtype == torch.float64
    transposed = pool.clone()
    transposed[5] = pool[5].transpose(-1, -2)
    moved = pool.clone()
    moved[[5, 6]] = pool[[6, 5]]
    for changed in (transposed, moved):
        assert core.relative_error(core.state_digest(changed), digest) > 0.1
    assert core.relative_error(core.state_digest(pool.clone()), digest) == 0.0


@pytest.fixture
def fake_triton(monkeypatch):
    """Triton's modules the loader imports, as stand-ins (CI has no Triton); and whatever the
    loader registers under ``vllm`` removed afterwards."""
    import importlib.machinery
    import types

    for name in ("triton", "triton.language", "triton.language.extra",
                 "triton.language.extra.libdevice"):  # fmt: skip
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__version__ = "0.fake"
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["triton"].language = sys.modules["triton.language"]
    sys.modules["triton.language"].extra = sys.modules["triton.language.extra"]
    sys.modules["triton.language.extra"].libdevice = sys.modules["triton.language.extra.libdevice"]
    yield
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def _fake_bundle(folder: Path, conv_source: str) -> Path:
    files = {
        "vllm/__init__.py": "raise RuntimeError('vllm/__init__.py ran')\n",
        module_path(KERNEL_MODULES["conv"]): conv_source,
        module_path(KERNEL_MODULES["packed_decode"]): """
            from .op import exp
            def fused_recurrent_gated_delta_rule_packed_decode():
                return exp
            """,
        "vllm/third_party/flash_linear_attention/ops/op.py": "exp = 'op.exp'\n",
        module_path(KERNEL_MODULES["spec_decode"]): """
            def fused_sigmoid_gating_delta_rule_update():
                pass
            """,
        module_path(KERNEL_MODULES["triton_norm"]): """
            from einops import rearrange
            from vllm.logger import init_logger
            from vllm.utils.platform_utils import num_compute_units
            def rmsnorm_fn():
                return init_logger("x").name
            """,
        module_path(KERNEL_MODULES["mtp_decode"]): """
            from vllm.utils.platform_utils import num_compute_units
            def fused_gdn_decode_post_conv_mtp_triton():
                return num_compute_units
            """,
        module_path(CONSTANTS_MODULE): "import vllm.config\nPAD_SLOT_ID = -1\nNULL_BLOCK_ID = 0\n",
        MANIFEST: json.dumps(dict(vllm_version="9.9.9")),
    }  # fmt: skip
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(textwrap.dedent(text))
    return folder


def test_the_loader_runs_no_vllm_init_and_stands_in_for_the_engine(tmp_path, fake_triton):
    folder = _fake_bundle(tmp_path, """
        from vllm.platforms import current_platform
        from vllm.triton_utils import tl, triton
        from vllm.v1.attention.backends.utils import NULL_BLOCK_ID
        def causal_conv1d_update():
            return current_platform.is_cpu(), current_platform.is_cuda(), NULL_BLOCK_ID
        """)  # fmt: skip
    einops_installed = importlib.util.find_spec("einops") is not None
    kernels = vllm_kernels(folder)
    assert not isinstance(kernels, str), kernels
    assert kernels.causal_conv1d_update() == (False, True, 0)
    assert kernels.packed_decode() == "op.exp"  # a relative import, from the bundle's file
    assert kernels.rmsnorm_fn() == "x"
    assert callable(kernels.mtp_decode())  # the stood-in SM count
    assert (kernels.null_block_id, kernels.version) == (0, "9.9.9 (Triton 0.fake)")
    assert "vllm.config" not in sys.modules  # the constants were read, not imported
    assert ("einops" in sys.modules) == einops_installed  # its stand-in left with the loading
    assert "already" in vllm_kernels(_fake_bundle(tmp_path / "other", ""))


def test_a_kernel_module_that_fails_to_load_makes_the_peer_missing(tmp_path, fake_triton):
    folder = _fake_bundle(tmp_path, "import vllm.not_in_the_bundle\n")
    reason = vllm_kernels(folder)
    assert isinstance(reason, str)
    assert "failed: ModuleNotFoundError" in reason and "vllm.not_in_the_bundle" in reason
    assert not [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]
