"""Every generated kernel compiles for its own SM target, without a GPU, within its resources.

For each variant of each target under generated/: two compile keys, the single-token decode
(pool, int32 slots, final state written) and the deepest multi-token verify (T = max_tokens,
int64 slots, separate write slots, intermediate states, no final write; a quantized state's:
every token's state stored in the cache and through a per-token slot table). ptxas must report no
spills and no stack (variants with launch bounds: the register cap held, small spills), a
register count the CTA can launch with, vector state loads, and packed fp32x2 FMAs exactly in
the variants that ask for them.
"""

import importlib
from pathlib import Path

import pytest

from gdngen.runtime.compile import CompileKey
from gdngen.runtime.resources import kernel_resources
from gdngen.spec import load_spec
from gdngen.spec.model import LOAD_CACHE_PTX, STORE_CACHE_PTX
from gdngen.sm import SM_FACTS
from gdngen.terms import SCALED_STATE_DTYPES, kernel_serves_head_dims
from gdngen.runtime.kernel_table import load_kernel

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "generated"


def _targets():
    return sorted(p.name for p in GENERATED.iterdir() if (p / "__init__.py").is_file())


def _cases():
    for target_name in _targets():
        target = importlib.import_module(f"generated.{target_name}")
        for variant in target.VARIANTS:
            yield pytest.param(target_name, variant, id=variant)


def _keys(info, module):
    served = [g for g in info.geometries if kernel_serves_head_dims(module, g.K, g.V)]
    geometry = max(served, key=lambda g: (g.HV, g.V))  # the largest shape the kernel is built for
    common = dict(
        variant=module.NAME, arch=info.sm, H=geometry.H, HV=geometry.HV, K=geometry.K,
        V=geometry.V, io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32",
        state_dtype=module.STATE_DTYPE, use_qk_l2norm=True,
    )  # fmt: skip
    yield CompileKey(
        tokens=1, index_dtype="int32", separate_write_slots=False, cache=False,
        write_final_state=True, **common,
    )  # fmt: skip
    if module.STATE_DTYPE in SCALED_STATE_DTYPES:
        # A quantized state's token stores, each quantizing the state with its rows' scales:
        # into the verify cache (in the state's format) and through vLLM's per-token slot table,
        # both in one kernel (no call passes both; each alone stores a subset of these).
        yield CompileKey(
            tokens=info.max_tokens, index_dtype="int64", separate_write_slots=False, cache=True,
            write_final_state=False, per_token_slots=True, num_accepted=True, **common,
        )  # fmt: skip
        return
    yield CompileKey(
        tokens=info.max_tokens, index_dtype="int64", separate_write_slots=True, cache=True,
        write_final_state=False, **common,
    )  # fmt: skip


#: ptxas spills, pinned to the byte: (target, variant, T) -> (spill stores, spill loads, stack
#: frame) in bytes. Each must be a form its target's dispatch never picks the variant for (no
#: rule uses it at that T). A change that moves a count fails here. None now:
#: - int8 `tv128_ilp8` (an sm_90a pick at T = 1 only) spilled 8 bytes at T = 8 with every
#:   token's state stored, from the warp-shared gates (docs/design.md, "Gates shared by the
#:   warp") until a row's scales were stored after all its words, under one branch
#:   (gdngen/device/quant.py, store_scaled_rows); 211 registers there now, unspilled.
#: - fp32 `tv32_ilp4_vec8_tpg32` on sm_120a and sm_121a spilled 4 bytes at T = 8 (80 registers)
#:   until the warp-shared gates; 104 registers there now, unspilled.
KNOWN_SPILLS: dict[tuple[str, str, int], tuple[int, int, int]] = {}


def test_known_spills_are_forms_the_dispatch_never_picks():
    for target_name, variant, tokens in KNOWN_SPILLS:
        target = importlib.import_module(f"generated.{target_name}")
        tables = [target.dispatch.TABLE, *target.dispatch.TABLES.values()]
        users = [rule for table in tables for rule in table if rule.use == variant]
        assert not any(
            rule.tokens.lo <= tokens and (rule.tokens.hi is None or tokens <= rule.tokens.hi)
            for rule in users
        ), (variant, tokens)


def test_every_target_is_checked():
    assert {"h200", "b200", "b300", "rtx_blackwell", "dgx_spark"} <= set(_targets())


@pytest.mark.parametrize("target_name,variant", list(_cases()))
def test_kernel_compiles_for_its_target(target_name, variant):
    target = importlib.import_module(f"generated.{target_name}")
    module = load_kernel(f"generated.{target_name}.kernels.{variant}")
    knobs = load_spec(ROOT / "specs" / f"{target_name}.yaml").variants_by_name[variant]
    registers_per_sm = SM_FACTS[target.INFO.sm].registers
    for key in _keys(target.INFO, module):
        found = kernel_resources(module, key)
        where = f"{variant} T={key.tokens} on {key.arch}: {found}"
        min_ctas = knobs.min_ctas_per_sm
        if min_ctas:
            # Launch bounds trade spills for occupancy (a choice the tuning measured): the cap
            # must hold, and what spills stays small next to the state tile it protects.
            assert found.registers <= registers_per_sm // (min_ctas * module.THREADS), where
            state_tile_bytes = module.ILP * module.VEC * 4
            assert found.spill_store_bytes <= 4 * state_tile_bytes, f"spills: {where}"
        else:
            stores, loads, stack = KNOWN_SPILLS.get((target_name, variant, key.tokens), (0, 0, 0))
            assert found.spill_store_bytes == stores, f"spills: {where}"
            assert found.spill_load_bytes == loads, f"spills: {where}"
            assert found.stack_bytes == stack, f"stack frame (local memory): {where}"
        assert 0 < found.registers <= 255, where
        assert found.registers * module.THREADS <= registers_per_sm, f"CTA cannot launch: {where}"
        loads_per_lane = module.ILP if module.LAYOUT == "k_last" else module.VEC
        assert found.vector_loads >= loads_per_lane, f"state loads were not vectorised: {where}"
        # Cache operators: the state accesses the knobs name carry one, on every vector of the
        # lane's tile (the state is the only vector access that may carry one).
        expected = set()
        if knobs.state_load_cache != "all":
            expected.add(f"ld.{LOAD_CACHE_PTX[knobs.state_load_cache]}")
        if knobs.state_store_cache != "write_back":
            expected.add(f"st.{STORE_CACHE_PTX[knobs.state_store_cache]}")
        cache_ops = dict(found.cache_ops)
        assert set(cache_ops) == expected, where
        assert all(count >= loads_per_lane for count in cache_ops.values()), where
        if knobs.packed_fma:
            assert found.packed_fp32x2 > 0, f"no packed fp32x2 instructions: {where}"
        else:
            assert found.packed_fp32x2 == 0, where
