"""Spec validation: specs/h200.yaml loads; every broken spec fails with the file, the field and the reason."""

import pytest
from pydantic import TypeAdapter, ValidationError

from gdngen.dispatch import coverage_gap
from gdngen.dispatch.rules import SpecRange
from gdngen.emit import KernelPlan
from gdngen.spec import Range, SpecError, Variant, load_spec, parse_spec, spec_sha256
from tests.spec_helpers import SNAPSHOT, SPEC_PATH, h200_dict, snapshot_dict, to_yaml

FILE = "x.yaml"
#: variants of the snapshot that no dispatch rule names (renaming them breaks nothing else)
UNUSED_KL_BF16 = 3  # kl_bf16_tv64_ilp4_vec8_tpg16
UNUSED_VL_FP32 = 11  # vl_fp32_tv32_ilp4_vec8_tpg16


def spec_error(data) -> str:
    text = data if isinstance(data, str) else to_yaml(data)
    with pytest.raises(SpecError) as info:
        parse_spec(text, FILE)
    return str(info.value)


def assert_names(message: str, *fragments: str) -> None:
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in message:\n{message}"


# -- the committed spec --------------------------------------------------------------------------


def test_h200_spec_loads():
    spec = load_spec(SPEC_PATH)
    assert (spec.target, spec.sm) == ("h200", "sm_90a")
    assert {(g.H, g.HV, g.K, g.V) for g in spec.geometries} >= {
        (16, 32, 128, 128),
        (16, 64, 128, 128),
    }
    assert spec.served == (
        ("k_last", "bf16"),
        ("k_last", "fp16"),
        ("k_last", "fp32"),
        ("k_last", "fp8_e4m3"),
        ("k_last", "int8"),
        ("v_last", "bf16"),
        ("v_last", "fp16"),
        ("v_last", "fp32"),
    )
    assert (
        coverage_gap(spec.dispatch, spec.served, spec.head_dims, spec.features.max_tokens) is None
    )
    names = [spec.variant_name(v) for v in spec.variants]
    assert len(set(names)) == len(names)
    assert all(name.endswith("_sm90") for name in names)
    assert {rule.use for rule in spec.dispatch} <= set(names)


def test_snapshot_is_valid():
    spec = parse_spec(SNAPSHOT, FILE)
    assert len(spec.variants) == 12 and len(spec.dispatch) == 9
    assert spec.variant_name(spec.variants[UNUSED_KL_BF16]) == "kl_bf16_tv64_ilp4_vec8_tpg16_sm90"
    assert spec.variant_name(spec.variants[UNUSED_VL_FP32]) == "vl_fp32_tv32_ilp4_vec8_tpg16_sm90"
    assert not {rule.use for rule in spec.dispatch} & {
        spec.variant_name(spec.variants[i]) for i in (UNUSED_KL_BF16, UNUSED_VL_FP32)
    }


def test_spec_hash_ignores_formatting_and_comments():
    from_file = load_spec(SPEC_PATH)
    reformatted = parse_spec(to_yaml(h200_dict()), FILE)
    assert reformatted == from_file
    assert spec_sha256(reformatted) == spec_sha256(from_file)
    changed = h200_dict()
    changed["description"] = "something else"
    assert spec_sha256(parse_spec(to_yaml(changed), FILE)) != spec_sha256(from_file)


def test_unreadable_spec_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match="cannot read spec") as info:
        load_spec(missing)
    assert str(missing) in str(info.value)


def test_load_spec_names_its_file(tmp_path):
    path = tmp_path / "broken.yaml"
    data = snapshot_dict()
    data["bogus"] = 1
    path.write_text(to_yaml(data))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert_names(str(info.value), str(path), "bogus", "unknown key")


# -- invalid specs -------------------------------------------------------------------------------


def _set(section: str, index: int | None, **fields):
    def mutate(data):
        target = data[section] if index is None else data[section][index]
        target.update(fields)

    return mutate


def _delete(section: str, index: int | None, key: str):
    def mutate(data):
        target = data if section == "" else data[section][index]
        del target[key]

    return mutate


def _append_duplicate(data):
    data["variants"].append(dict(data["variants"][UNUSED_KL_BF16]))


def _drop_rule(index: int):
    return lambda data: data["dispatch"].pop(index)


# (id, mutation of the snapshot, [field path, fragments of the reason...])
INVALID = [
    ("unknown_top_level_key", lambda d: d.update(bogus=1), ["bogus", "unknown key"]),
    (
        "unknown_variant_key",
        _set("variants", UNUSED_KL_BF16, tile=8),
        ["variants[3].tile", "unknown key"],
    ),
    (
        "unknown_geometry_key",
        _set("geometries", 1, heads=4),
        ["geometries[1].heads", "unknown key"],
    ),
    (
        "unknown_rule_key",
        _set("dispatch", 0, token=[1, 8]),
        ["dispatch[0].token", "unknown key"],
    ),
    (
        "k_not_a_head_dim",  # 8 lanes * 4 bf16 = K 32
        _set("variants", UNUSED_KL_BF16, threads_per_group=8, vec=4),
        ["variants[3]", "threads_per_group * vec must be a head dimension", "8 * 4 = 32"],
    ),
    (
        "k_512_not_a_head_dim",  # 32 lanes * 16 bf16 (two 16-byte loads a row) = K 512
        _set("variants", UNUSED_KL_BF16, threads_per_group=32, vec=16),
        ["variants[3]", "must be a head dimension K", "1 * 32 * 16 = 512"],
    ),
    (
        "no_geometry_with_k",  # 8 lanes * 8 bf16 = K 64: a head dim, but no geometry has it
        _set("variants", UNUSED_KL_BF16, threads_per_group=8, vec=8),
        ["variants[3]", "kl_bf16_tv64_ilp4_vec8_tpg8_sm90", "K=64", "no geometry"],
    ),
    (
        "no_geometry_with_v_divisible",  # tile_v 256 does not divide V=128
        _set("variants", UNUSED_KL_BF16, tile_v=256),
        ["variants[3]", "tile_v=256", "no geometry"],
    ),
    (
        "tile_v_not_multiple_of_ilp",
        _set("variants", UNUSED_KL_BF16, tile_v=18),
        ["variants[3]", "tile_v must be a multiple of ilp", "tile_v=18, ilp=4"],
    ),
    (
        "ilp_not_power_of_two",
        _set("variants", UNUSED_KL_BF16, ilp=3, tile_v=48),
        ["variants[3]", "powers of two", "ilp=3"],
    ),
    (
        "load_bytes_bf16_vec2_k_last",
        _set("variants", UNUSED_KL_BF16, vec=2),
        ["variants[3]", "8 or 16 bytes", "vec", "2 x 2 B = 4 B"],
    ),
    (
        "row_loads_bf16_vec32_k_last",  # 64 B of a row: four 16-byte loads
        _set("variants", UNUSED_KL_BF16, vec=32, threads_per_group=4),
        ["variants[3]", "at most 2 loads of 16 bytes", "32 x 2 B = 64 B"],
    ),
    (
        "load_bytes_fp32_ilp8_v_last",
        _set("variants", UNUSED_VL_FP32, ilp=8),
        ["variants[11]", "8 or 16 bytes", "ilp", "8 x 4 B = 32 B"],
    ),
    (
        "threads_not_whole_warps",  # one group of 16 lanes
        _set("variants", UNUSED_KL_BF16, tile_v=4),
        ["variants[3]", "whole warps", "4 / 4 * 16 = 16 threads"],
    ),
    (
        "too_many_threads",  # 256 groups of 16 lanes
        _set("variants", UNUSED_KL_BF16, tile_v=512, ilp=2),
        ["variants[3]", "4096 threads per CTA exceeds 1024"],
    ),
    (
        "tpg_not_allowed",
        _set("variants", UNUSED_KL_BF16, threads_per_group=64),
        ["variants[3].threads_per_group", "1, 2, 4, 8, 16 or 32"],
    ),
    (
        "packed_fma_on_sm90a",
        _set("variants", UNUSED_KL_BF16, packed_fma=True),
        [
            "variants[3]",
            "kl_bf16_tv64_ilp4_vec8_tpg16_pfma_sm90",
            "packed_fma needs sm_100a",
            "sm_90a",
        ],
    ),
    (
        "hv_not_multiple_of_h",
        _set("geometries", 0, HV=40),
        ["geometries[0]", "HV must be a multiple of H", "H=16, HV=40"],
    ),
    (
        "head_dim_96",
        _set("geometries", 0, K=96),
        ["geometries[0]", "K: head dimension must be one of (64, 128, 256)", "96"],
    ),
    (
        "geometry_name_with_a_space",
        _set("geometries", 0, name="qwen 3"),
        ["geometries[0]", "name must match", "'qwen 3'"],
    ),
    (
        "geometry_without_heads",
        _set("geometries", 0, H=0),
        ["geometries[0]", "H and HV must be positive", "H=0"],
    ),
    (
        "duplicate_geometry_name",
        _set("geometries", 1, name="qwen3-next"),
        ["geometries", "names must be unique"],
    ),
    (
        "duplicate_variant",
        _append_duplicate,
        ["variants[12]", "duplicate variant kl_bf16_tv64_ilp4_vec8_tpg16_sm90"],
    ),
    (
        "unknown_sm",
        lambda d: d.update(sm="sm_80"),
        ["sm", "'sm_90a', 'sm_100a', 'sm_103a', 'sm_120a' or 'sm_121a'"],
    ),
    (
        "max_tokens_too_large",
        _set("features", None, max_tokens=17),
        ["features.max_tokens", "less than or equal to 16"],
    ),
    (
        "dispatch_unknown_variant",
        _set("dispatch", 0, use="kl_bf16_tv8_ilp2_vec8_tpg16_sm100"),
        ["dispatch[0].use", "unknown variant 'kl_bf16_tv8_ilp2_vec8_tpg16_sm100'"],
    ),
    (
        "dispatch_variant_other_layout",
        _set("dispatch", 0, use="vl_bf16_tv16_ilp8_vec8_tpg16_sm90"),
        ["dispatch[0]", "rule is for k_last/bf16", "is a v_last/bf16 kernel"],
    ),
    (
        "dispatch_variant_other_dtype",
        _set("dispatch", 0, use="kl_fp32_tv8_ilp2_vec4_tpg32_sm90"),
        ["dispatch[0]", "rule is for k_last/bf16", "is a k_last/fp32 kernel"],
    ),
    (
        "dispatch_gap_batch_heads",
        _drop_rule(1),  # k_last bf16 batch_heads 257..1024
        ["dispatch", "no rule serves", "layout=k_last state_dtype=bf16 tokens=1 batch_heads=257"],
    ),
    (
        "dispatch_gap_tokens",
        _set("dispatch", 3, tokens=[1, 7]),  # k_last fp32, batch_heads 1..256
        ["dispatch", "no rule serves", "layout=k_last state_dtype=fp32 tokens=8 batch_heads=1"],
    ),
    (
        "dispatch_gap_intermediate",
        _set("dispatch", 7, intermediate="yes"),  # v_last fp32, batch_heads 1..256
        ["dispatch", "layout=v_last state_dtype=fp32 tokens=1 batch_heads=1 intermediate=no"],
    ),
    (
        "dispatch_tokens_beyond_max_tokens",
        _set("dispatch", 0, tokens=[1, 9]),
        ["dispatch[0].tokens", "hi=9 exceeds features.max_tokens=8"],
    ),
    (
        "dispatch_empty_range",
        _set("dispatch", 0, tokens=[5, 2]),
        ["dispatch[0].tokens", "empty range: lo=5 > hi=2"],
    ),
    (
        "dispatch_range_three_items",
        _set("dispatch", 0, batch_heads=[1, 2, 3]),
        ["dispatch[0].batch_heads", "a range is [lo, hi]"],
    ),
    (
        "dispatch_bad_intermediate",
        _set("dispatch", 0, intermediate="maybe"),
        ["dispatch[0].intermediate", "'any', 'yes' or 'no'"],
    ),
    ("missing_top_level_field", _delete("", None, "sm"), ["sm", "required field is missing"]),
    (
        "missing_variant_field",
        _delete("variants", 0, "ilp"),
        ["variants[0].ilp", "required field is missing"],
    ),
    (
        "missing_rule_field",
        _delete("dispatch", 4, "use"),
        ["dispatch[4].use", "required field is missing"],
    ),
    (
        "no_variants",
        lambda d: d.update(variants=[]),
        ["variants", "at least 1"],
    ),
]


@pytest.mark.parametrize(
    "mutate,fragments", [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_invalid_spec(mutate, fragments):
    data = snapshot_dict()
    mutate(data)
    message = spec_error(data)
    assert message.startswith(f"{FILE}: invalid spec")
    path, *reason = fragments
    # a field's own check puts its path first; a check across fields (on the whole spec) names it
    # first in the reason
    assert f"\n  {path}" in message or f"\n  (top level): {path}" in message, message
    assert_names(message, *reason)


def test_every_problem_is_listed():
    data = snapshot_dict()
    data["bogus"] = 1
    data["geometries"][0]["K"] = 96
    message = spec_error(data)
    assert_names(message, "(2 problem(s))", "bogus: unknown key", "geometries[0]: K:")


def test_k_64_variant_is_a_valid_knob_point():
    variant = Variant(
        layout="k_last", state_dtype="bf16", tile_v=64, ilp=4, vec=8, threads_per_group=8
    )
    assert variant.head_k_dim == 64
    assert variant.name_for("sm_90a") == "kl_bf16_tv64_ilp4_vec8_tpg8_sm90"


def test_geometry_with_other_head_dim_than_dispatched_variants_is_rejected():
    """A geometry of K=64 whose calls the rules (which name no head dims) route to K=128 kernels."""
    data = snapshot_dict()
    data["geometries"].append({"name": "small", "H": 8, "HV": 16, "K": 64, "V": 64})
    message = spec_error(data)
    assert_names(message, "dispatch[0].use", "geometry small (K=64, V=64)", "head_dims: [64, 64]")


def _with_head_dim_64(data: dict) -> dict:
    """The snapshot plus a K=V=64 geometry, a K=64 kernel of each pair and rules naming them."""
    data["geometries"].append({"name": "small", "H": 8, "HV": 16, "K": 64, "V": 64})
    rules = []
    for layout, dtype, knobs in (
        ("k_last", "bf16", dict(tile_v=16, ilp=2, vec=8, threads_per_group=8)),
        ("k_last", "fp32", dict(tile_v=16, ilp=2, vec=4, threads_per_group=16)),
        ("v_last", "bf16", dict(tile_v=64, ilp=8, vec=8, threads_per_group=8)),
        ("v_last", "fp32", dict(tile_v=32, ilp=4, vec=8, threads_per_group=8)),
    ):
        data["variants"].append({"layout": layout, "state_dtype": dtype, **knobs})
        name = Variant(layout=layout, state_dtype=dtype, **knobs).name_for("sm_90a")
        rules.append({"layout": layout, "state_dtype": dtype, "head_dims": [64, 64],
                      "tokens": [1, 8], "batch_heads": [1, None], "use": name})  # fmt: skip
    data["dispatch"] = rules + data["dispatch"]
    return data


def test_rules_with_head_dims_let_one_spec_serve_two_head_dims():
    spec = parse_spec(to_yaml(_with_head_dim_64(snapshot_dict())), FILE)
    assert spec.head_dims == ((64, 64), (128, 128))
    assert coverage_gap(spec.dispatch, spec.served, spec.head_dims, 8) is None


def test_a_head_dims_rule_after_the_general_rules_is_shadowed_and_rejected():
    data = _with_head_dim_64(snapshot_dict())
    data["dispatch"] = data["dispatch"][4:] + data["dispatch"][:4]  # general rules first
    assert_names(spec_error(data), "dispatch[0].use: kl_bf16_tv8_ilp2_vec8_tpg16_sm90 serves K=128",
                 "geometry small (K=64, V=64)")  # fmt: skip


def test_a_pair_without_rules_for_some_head_dims_leaves_a_gap():
    data = _with_head_dim_64(snapshot_dict())
    for rule in data["dispatch"][4:]:
        rule["head_dims"] = [128, 128]  # the general rules now serve K=128 only
    del data["dispatch"][3]  # and v_last/fp32 has no K=64 rule left
    assert_names(spec_error(data), "dispatch: no rule serves layout=v_last state_dtype=fp32",
                 "head_dims=K64xV64", "at the head dims of every geometry")  # fmt: skip


def test_a_rule_for_head_dims_no_geometry_has_is_rejected():
    data = snapshot_dict()
    data["dispatch"][0]["head_dims"] = [256, 256]
    assert_names(spec_error(data), "dispatch[0].head_dims: [256, 256] is not the (K, V) of any "
                 "geometry ([128, 128])")  # fmt: skip


def test_the_tuning_grid_measures_one_head_dims():
    data = _with_head_dim_64(snapshot_dict())
    data["tuning"] = {"gpu": "H200", "heads": [16, 32]}  # HV=16 is only the K=64 geometry
    assert_names(spec_error(data), "tuning.heads: their geometries have head dims [(64, 64), "
                 "(128, 128)]")  # fmt: skip
    data["tuning"]["heads"] = [32, 64]
    assert parse_spec(to_yaml(data), FILE).tuning_head_dims == (128, 128)


def test_a_variant_for_other_head_dims_leaves_the_timings_valid():
    """The timings of a pair were taken among the variants built for the measured head dims:
    a kernel for K=64 added to the pair was not a candidate, so the pair's hash stays."""
    from gdngen.tune.tuning_file import pair_sha256

    data = snapshot_dict()
    data["tuning"] = {"gpu": "H200"}
    before = parse_spec(to_yaml(data), FILE)
    after = parse_spec(to_yaml(_with_head_dim_64(data)), FILE)
    for pair in before.served:
        assert pair_sha256(after, *pair) == pair_sha256(before, *pair)
    data["variants"].append({"layout": "k_last", "state_dtype": "bf16", "tile_v": 128, "ilp": 4,
                             "vec": 8, "threads_per_group": 16})  # fmt: skip
    changed = parse_spec(to_yaml(data), FILE)
    assert pair_sha256(changed, "k_last", "bf16") != pair_sha256(before, "k_last", "bf16")


def test_packed_fma_is_valid_on_sm100a():
    data = snapshot_dict()
    data["sm"] = "sm_100a"
    for rule in data["dispatch"]:
        rule["use"] = rule["use"].replace("_sm90", "_sm100")
    data["variants"][UNUSED_KL_BF16]["packed_fma"] = True
    spec = parse_spec(to_yaml(data), FILE)
    assert "kl_bf16_tv64_ilp4_vec8_tpg16_pfma_sm100" in spec.variants_by_name


def test_dispatched_variant_must_serve_every_geometry_it_is_routed():
    """A rule without head dims routes calls of every geometry of the target to its variant, so
    a dispatched variant whose tile_v does not divide some geometry's V can never run that
    geometry: the spec must be rejected, not fail at the first call on the GPU."""
    data = snapshot_dict()
    data["geometries"].append({"name": "narrow-v", "H": 16, "HV": 32, "K": 128, "V": 64})
    data["variants"].append(
        {
            "layout": "k_last",
            "state_dtype": "bf16",
            "tile_v": 128,
            "ilp": 4,
            "vec": 8,
            "threads_per_group": 16,
        }
    )
    data["dispatch"][2]["use"] = "kl_bf16_tv128_ilp4_vec8_tpg16_sm90"
    message = spec_error(data)
    assert_names(message, "dispatch[2]", "kl_bf16_tv128_ilp4_vec8_tpg16_sm90", "narrow-v")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("target: h200\nsm: [unclosed\n", "not valid YAML"),
        ("- target: h200\n- sm: sm_90a\n", "expected a mapping at the top level, got list"),
        ("", "expected a mapping at the top level, got NoneType"),
        ("just a string", "expected a mapping at the top level, got str"),
    ],
    ids=["malformed", "top_level_list", "empty", "top_level_scalar"],
)
def test_not_a_spec_document(text, expected):
    message = spec_error(text)
    assert message.startswith(f"{FILE}: ")
    assert expected in message


# -- Range shorthand -----------------------------------------------------------------------------

#: a rule's range field as a spec's validation reads it
SPEC_RANGE = TypeAdapter(SpecRange)


@pytest.mark.parametrize(
    "given,lo,hi",
    [
        (3, 3, 3),
        ([2, 8], 2, 8),
        ([257, None], 257, None),
        ({"lo": 2, "hi": 8}, 2, 8),
        ({"lo": 4}, 4, None),
    ],
    ids=["int", "pair", "open_pair", "mapping", "mapping_open"],
)
def test_range_shorthand(given, lo, hi):
    r = SPEC_RANGE.validate_python(given)
    assert (r.lo, r.hi) == (lo, hi)


def test_range_contains():
    closed, single, open_ = (
        SPEC_RANGE.validate_python([2, 8]),
        SPEC_RANGE.validate_python(3),
        SPEC_RANGE.validate_python([257, None]),
    )
    assert [closed.contains(x) for x in (1, 2, 8, 9)] == [False, True, True, False]
    assert [single.contains(x) for x in (2, 3, 4)] == [False, True, False]
    assert [open_.contains(x) for x in (256, 257, 10**9)] == [False, True, True]


@pytest.mark.parametrize("given", [0, [0, 4], [5, 2], [1, 2, 3], True, "1-8"], ids=str)
def test_range_rejects(given):
    with pytest.raises(ValidationError):
        SPEC_RANGE.validate_python(given)


def test_range_shorthand_in_yaml():
    spec = parse_spec(SNAPSHOT, FILE)  # written as [1, 8] and [1025, null]
    assert spec.dispatch[2].batch_heads == Range(lo=1025, hi=None)
    assert spec.dispatch[0].tokens == Range(lo=1, hi=8)
    data = snapshot_dict()
    for rule in data["dispatch"]:
        rule["tokens"] = {"lo": 1, "hi": 8} if rule["layout"] == "k_last" else [1, None]
    spec = parse_spec(to_yaml(data), FILE)
    assert {rule.tokens for rule in spec.dispatch} == {Range(lo=1, hi=8), Range(lo=1, hi=None)}


# -- Variant derived numbers ---------------------------------------------------------------------

#: the numbers of test_variant_derived that the emit plan derives (gdngen/emit/plan.py)
PLAN_NUMBERS = {"lane_stride", "butterfly_offsets", "loads_per_lane"}
K_LAST = dict(layout="k_last", state_dtype="bf16", tile_v=32, ilp=4, vec=8, threads_per_group=16)
V_LAST = dict(layout="v_last", state_dtype="fp32", tile_v=16, ilp=4, vec=8, threads_per_group=16)
# 8 fp32 columns of a row a lane: two 16-byte loads (MAX_ROW_LOADS)
K_LAST_TWO_LOADS = dict(
    layout="k_last", state_dtype="fp32", tile_v=32, ilp=4, vec=8, threads_per_group=32
)


@pytest.mark.parametrize(
    "knobs,expected",
    [
        (
            K_LAST,
            dict(
                sm90="kl_bf16_tv32_ilp4_vec8_tpg16_sm90",
                sm100="kl_bf16_tv32_ilp4_vec8_tpg16_sm100",
                groups=8,
                threads=128,
                head_k_dim=128,
                lane_stride=1,
                butterfly_offsets=(8, 4, 2, 1),
                load_elems=8,
                load_bytes=16,
                loads_per_lane=4,
                state_regs=32,
            ),
        ),
        (
            V_LAST,
            dict(
                sm90="vl_fp32_tv16_ilp4_vec8_tpg16_sm90",
                sm100="vl_fp32_tv16_ilp4_vec8_tpg16_sm100",
                groups=4,
                threads=64,
                head_k_dim=128,
                lane_stride=2,  # two groups interleave in a warp
                butterfly_offsets=(16, 8, 4, 2),
                load_elems=4,
                load_bytes=16,
                loads_per_lane=8,
                state_regs=32,
            ),
        ),
        (
            K_LAST_TWO_LOADS,
            dict(
                sm90="kl_fp32_tv32_ilp4_vec8_tpg32_sm90",
                sm100="kl_fp32_tv32_ilp4_vec8_tpg32_sm100",
                groups=8,
                threads=256,
                head_k_dim=256,  # one warp, no K split
                row_loads=2,
                load_elems=4,
                load_bytes=16,
                loads_per_lane=8,
                state_regs=32,
            ),
        ),
    ],
    ids=["k_last", "v_last", "k_last_two_loads"],
)
def test_variant_derived(knobs, expected):
    expected = dict(expected)
    variant = Variant(**knobs)
    plan = KernelPlan.of(variant, "sm_90a")
    assert variant.name_for("sm_90a") == expected.pop("sm90")
    assert variant.name_for("sm_100a") == expected.pop("sm100")
    for prop, value in expected.items():
        # the numbers of the code itself are the emit plan's; those the constraints need, the spec's
        holder = plan if prop in PLAN_NUMBERS else variant
        assert getattr(holder, prop) == value, prop


def test_variant_name_marks_packed_fma():
    variant = Variant(**{**K_LAST, "packed_fma": True})
    assert variant.name_for("sm_100a") == "kl_bf16_tv32_ilp4_vec8_tpg16_pfma_sm100"


@pytest.mark.parametrize(
    "knobs,offsets",
    [
        (dict(layout="k_last", state_dtype="fp32", vec=4, threads_per_group=32), (16, 8, 4, 2, 1)),
        (dict(layout="v_last", state_dtype="fp32", vec=16, threads_per_group=8), (16, 8, 4)),
    ],
    ids=["k_last_tpg32", "v_last_tpg8"],
)
def test_butterfly_stays_within_the_group(knobs, offsets):
    plan = KernelPlan.of(Variant(tile_v=32, ilp=4, **knobs), "sm_90a")
    assert plan.butterfly_offsets == offsets
    # XOR by the offsets reaches exactly the lanes of lane 0's group, all of them
    group = {0}
    for offset in plan.butterfly_offsets:
        group |= {lane ^ offset for lane in group}
    assert group == set(range(0, 32, plan.lane_stride))
    assert len(group) == plan.threads_per_group
