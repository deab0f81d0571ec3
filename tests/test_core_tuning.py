"""The decode core's tuning (docs/design.md, "Tuning the decode core"): the spec's core grid,
core cells in tuning files, the rules emit makes of them and where a table holds those rules.
The timing itself runs on a GPU (tests/gpu/test_bench_tune_gpu.py)."""

import pytest
import torch

from gdngen.dispatch import CallShape, Range, core_rules, select
from gdngen.emit.plan import dispatch_files, dispatch_rules
from gdngen.emit.render import render
from gdngen.spec import SpecError, parse_spec
from gdngen.terms import plan_name, plan_parts
from gdngen.tune.core import core_plans
from gdngen.tune.tuning_file import (
    Cell,
    Measured,
    TuningFile,
    dump_tuning,
    load_tuning,
    pair_sha256,
    set_key,
    stale_pairs,
    variants_sha256,
)
from tests.spec_helpers import SPEC_PATH, h200_dict, to_yaml

FUSED_BF16 = "kl_bf16_tv128_ilp8_vec8_tpg16_sm90"
SPLIT_BF16 = "kl_bf16_tv64_ilp8_vec8_tpg16_sm90"
FUSED_FP32 = "kl_fp32_tv64_ilp8_vec4_tpg32_sm90"
#: a head over 16 CTAs: no epilogue of its own (only the steps plan can take it)
BARE_FP32 = "kl_fp32_tv8_ilp8_vec4_tpg32_sm90"
#: a variant specs/h200.yaml does not have, that is a core candidate only (gated_norm_only)
ADDED_CORE_CANDIDATE = {"layout": "k_last", "state_dtype": "bf16", "tile_v": 32, "ilp": 8,
                        "vec": 8, "threads_per_group": 16, "gated_norm_only": True}  # fmt: skip
#: one that is a plain candidate only (a head over 16 CTAs: no epilogue)
ADDED_PLAIN_CANDIDATE = {"layout": "k_last", "state_dtype": "fp32", "tile_v": 8, "ilp": 4,
                         "vec": 4, "threads_per_group": 32}  # fmt: skip


@pytest.fixture(scope="module")
def spec():
    return parse_spec(SPEC_PATH.read_text(), str(SPEC_PATH))


def _core_cells(tokens=(1, 2, 4)) -> list[Cell]:
    """k_last/bf16 core cells: the fused tv128 plan wins below B*HV 4096, the split tv64 plan
    from there up; k_last/fp32: the fused tv64 plan everywhere."""
    cells = []
    for T in tokens:
        for HV in (32, 64):
            for batch in (1, 64, 256):
                bh = batch * HV
                fused, split = 5.0 + bh * 0.01, (4.0 + bh * 0.009 if bh >= 4096 else 99.0)
                cells.append(Cell(
                    layout="k_last", state_dtype="bf16", tokens=T, mode="core", HV=HV,
                    batch=batch,
                    times_us={FUSED_BF16: round(fused, 2), plan_name(SPLIT_BF16, True): split},
                ))  # fmt: skip
                cells.append(Cell(
                    layout="k_last", state_dtype="fp32", tokens=T, mode="core", HV=HV,
                    batch=batch,
                    times_us={FUSED_FP32: 6 + bh * 0.02, plan_name(FUSED_FP32, True): 7 + bh * 0.03},
                ))  # fmt: skip
    return cells


def _core_file(spec, cells) -> TuningFile:
    hashes = {
        set_key("k_last", d, None, spec, core=True): pair_sha256(spec, "k_last", d, core=True)
        for d in ("bf16", "fp32")
    }
    return TuningFile(
        target="h200", sm="sm_90a", gpu="NVIDIA H100 80GB HBM3", date="2026-11-28",
        command="gdngen tune specs/h200.yaml --core", variants_sha256=hashes,
        copy_bw_tbps=3.0, cells=cells,
    )  # fmt: skip


def test_plan_names_round_trip():
    assert plan_parts(plan_name(SPLIT_BF16, True)) == (SPLIT_BF16, True, False, True)
    assert plan_parts(plan_name(SPLIT_BF16, False)) == (SPLIT_BF16, False, False, True)
    assert plan_parts(plan_name(BARE_FP32, True, True)) == (BARE_FP32, True, True, True)
    assert plan_name(SPLIT_BF16, True) == "split:" + SPLIT_BF16
    assert plan_name(BARE_FP32, True, True) == "steps:" + BARE_FP32
    with pytest.raises(ValueError, match="split_norm: .*splits the conv too"):
        plan_name(BARE_FP32, False, True)


def test_a_steps_plan_that_wins_becomes_a_norm_split_rule(spec):
    # fp32 cells where the steps plan (a variant without the epilogue between the two steps)
    # wins from B*HV 4096: its rules split both steps off and name the bare variant
    cells = []
    for HV in (32, 64):
        for batch in (1, 64, 256):
            bh = batch * HV
            steps = 4.0 + bh * 0.015 if bh >= 4096 else 99.0
            cells.append(Cell(
                layout="k_last", state_dtype="fp32", tokens=1, mode="core", HV=HV, batch=batch,
                times_us={FUSED_FP32: 6 + bh * 0.02, plan_name(FUSED_FP32, True): 7 + bh * 0.03,
                          plan_name(BARE_FP32, True, True): steps},
            ))  # fmt: skip
    rules = core_rules(cells, (128, 128))
    assert [(r.use, r.split_conv, r.split_norm) for r in rules] == [
        (FUSED_FP32, False, False),
        (BARE_FP32, True, True),
    ]
    assert rules[1].batch_heads.hi is None and rules[1].gated_norm
    # emitted, the row names the plan by keyword, and reads back as the same rule
    measured = Measured(name="specs/h200.tuning.h100.yaml", cells=tuple(cells))
    namespace: dict = {}
    exec(render(dispatch_files(spec, "specs/h200.yaml", None, {"H100": measured})[0]), namespace)
    h100 = namespace["TABLES"]["H100"]
    assert rules[1] in h100


def test_plans_without_pdl_round_trip():
    name = plan_name(FUSED_BF16, False, pdl=False)
    assert name == "nopdl:" + FUSED_BF16
    assert plan_parts(name) == (FUSED_BF16, False, False, False)
    steps = plan_name(BARE_FP32, True, True, pdl=False)
    assert steps == "nopdl:steps:" + BARE_FP32
    assert plan_parts(steps) == (BARE_FP32, True, True, False)


def test_the_cells_a_held_rule_serves_time_its_plan_without_pdl(spec):
    from gdngen.measure.core_cell import core_problem
    from gdngen.tune.core import pdl_off_plans

    # specs/h200.yaml holds PDL off for bf16's head-per-CTA kernel at T = 1 from B*HV 1024
    held = [r for r in spec.dispatch if r.conv1d and not r.pdl and r.state_dtype == "bf16"]
    assert [(r.use, r.tokens, r.batch_heads.lo) for r in held] == [(FUSED_BF16, Range(1, 1), 1024)]
    for batch, tokens, dtype, expected in [
        (16, 1, "bf16", ["nopdl:" + FUSED_BF16]),  # B*HV 1024
        (15, 1, "bf16", []),
        (512, 2, "bf16", []),
        (512, 1, "fp32", []),
    ]:
        problem = core_problem(batch, tokens, 64, dtype, H=16, K=128, V=128)
        assert pdl_off_plans(spec, problem) == expected, (batch, tokens, dtype)


def _held_cells(nopdl_us: float | None) -> list[Cell]:
    """bf16 T = 1 core cells at HV 64 where the steps plan wins over the plans with PDL; with
    ``nopdl_us``, the held rule's plan without PDL timed too (from B = 16, B*HV 1024)."""
    cells = []
    for batch in (1, 16, 256):
        bh = batch * 64
        times = {FUSED_BF16: 5.0 + bh * 0.02, plan_name(BARE_FP32, True, True): 9.0 + bh * 0.015}
        if nopdl_us is not None and bh >= 1024:
            times[plan_name(FUSED_BF16, False, pdl=False)] = nopdl_us * bh
        cells.append(Cell(layout="k_last", state_dtype="bf16", tokens=1, mode="core", HV=64,
                          batch=batch, times_us=times))  # fmt: skip
    return cells


def _emitted_h100(spec, cells) -> tuple:
    measured = Measured(name="specs/h200.tuning.h100.yaml", cells=tuple(cells))
    namespace: dict = {}
    exec(render(dispatch_files(spec, "specs/h200.yaml", None, {"H100": measured})[0]), namespace)
    return namespace["TABLES"]["H100"]


def test_a_held_rule_goes_first_until_the_cells_time_it(spec):
    bf16_t1 = dict(layout="k_last", state_dtype="bf16", tokens=1, intermediate=False,
                   head_dims=(128, 128), gated_norm=True, conv1d=True, heads=64)  # fmt: skip
    big = CallShape(batch_heads=256 * 64, **bf16_t1)
    # cells without the plan without PDL: the spec's held rule serves B*HV >= 1024 first; the
    # measured steps rule behind it serves the calls below that it won (from B*HV 256)
    table = _emitted_h100(spec, _held_cells(None))
    rule = select(table, big)
    assert (rule.use, rule.pdl, rule.source) == (FUSED_BF16, False, "spec[7]")
    assert select(table, CallShape(batch_heads=512, **bf16_t1)).split_norm
    # cells that timed it: their verdicts decide, with PDL off where that plan won
    table = _emitted_h100(spec, _held_cells(0.001))  # faster than every plan with PDL
    rule = select(table, big)
    assert (rule.use, rule.pdl, rule.source[:2]) == (FUSED_BF16, False, "t:")
    # bf16's held rule is no longer ahead of them (fp16's, whose cells are not timed, still is)
    ahead = [r.source for r in table[: table.index(rule)] if not r.source.startswith("t:")]
    assert ahead == ["spec[8]"]
    table = _emitted_h100(spec, _held_cells(1.0))  # slower: the steps plan with PDL
    rule = select(table, big)
    assert (rule.use, rule.split_norm, rule.pdl) == (BARE_FP32, True, True)


def test_a_rule_held_twice_is_reached_at_its_first_place_only(spec):
    from gdngen.dispatch import reached, reached_at

    rules = list(spec.dispatch)
    doubled = [rules[7], *rules]
    at = reached_at(doubled, spec.served, spec.head_dims, spec.features.max_tokens, spec.fusions)
    assert 0 in at and 8 not in at
    assert reached(doubled, spec.served, spec.head_dims, spec.features.max_tokens,
                   spec.fusions).count(rules[7]) == 1  # fmt: skip


def test_the_steps_plan_of_a_cell_is_its_bare_recurrences_variant():
    import generated.h200 as h200
    from gdngen.measure.core_cell import core_problem
    from gdngen.tune.core import steps_plan

    for T, B in ((1, 512), (1, 4), (4, 64)):
        problem = core_problem(B, T, 64, "fp32")
        variant, split_conv, split_norm, _ = plan_parts(steps_plan(h200, problem))
        assert split_conv and split_norm
        bare = h200.select(
            layout="k_last", state_dtype="fp32", tokens=T, batch_heads=B * 64,
            intermediate=T > 1, head_dims=(128, 128), heads=64, packed=True,
            per_token_slots=T > 1,
        )  # fmt: skip
        assert variant == bare.use and not bare.gated_norm


def test_the_core_hash_covers_the_plain_candidates_only_with_steps(spec):
    assert spec.tuning.core.steps  # specs/h200.yaml times the steps plans
    data = h200_dict()
    data["tuning"]["core"]["steps"] = False
    unstepped = parse_spec(to_yaml(data), "specs/h200.yaml")
    assert pair_sha256(unstepped, "k_last", "fp32", core=True) != pair_sha256(
        spec, "k_last", "fp32", core=True
    )
    assert pair_sha256(spec, "k_last", "fp32", core=True, steps=False) == pair_sha256(
        unstepped, "k_last", "fp32", core=True
    )
    # a variant the plain tuning times (a head over 16 CTAs: not a core candidate) is added:
    # with steps, the core cells go stale too; without, they keep
    data["variants"].append(dict(ADDED_PLAIN_CANDIDATE))
    unstepped_added = parse_spec(to_yaml(data), "specs/h200.yaml")
    assert unstepped_added.variant_name(unstepped_added.variants[-1]) not in spec.variants_by_name
    assert pair_sha256(unstepped_added, "k_last", "fp32", core=True) == pair_sha256(
        unstepped, "k_last", "fp32", core=True
    )
    data["tuning"]["core"]["steps"] = True
    added = parse_spec(to_yaml(data), "specs/h200.yaml")
    assert pair_sha256(added, "k_last", "fp32", core=True) != pair_sha256(
        spec, "k_last", "fp32", core=True
    )


def test_core_cells_timed_without_the_steps_plans_still_hold(spec):
    # An H100 file tuned before the grid timed steps plans: its fused and split timings are
    # still true, so its rules stay (their verdicts are among those plans)
    data = h200_dict()
    data["tuning"]["core"]["steps"] = False
    unstepped = parse_spec(to_yaml(data), "specs/h200.yaml")
    tuning = _core_file(unstepped, _core_cells(tokens=(1,)))
    assert stale_pairs(tuning, spec) == {}
    # ... until a core candidate changes: then they are stale either way
    data["tuning"]["core"]["steps"] = True
    data["variants"].append(dict(ADDED_CORE_CANDIDATE))
    changed = parse_spec(to_yaml(data), "specs/h200.yaml")
    assert set(stale_pairs(tuning, changed)) == {"k_last/bf16 core"}
    # and a file that recorded the steps plans' hash holds only while the plain candidates do
    stepped = _core_file(spec, _core_cells(tokens=(1,)))
    assert stale_pairs(stepped, spec) == {}
    data = h200_dict()
    data["variants"].append(dict(ADDED_PLAIN_CANDIDATE))
    plain_added = parse_spec(to_yaml(data), "specs/h200.yaml")
    assert "k_last/fp32 core" in stale_pairs(stepped, plain_added)


def test_core_candidates_have_the_epilogue_and_both_plans(spec):
    for state_dtype in ("bf16", "fp32"):
        plans = core_plans(spec, "k_last", state_dtype)
        variants = spec.core_candidates("k_last", state_dtype)
        assert len(plans) == 2 * len(variants) and len(variants) >= 5
        for name in variants:
            variant = spec.variants_by_name[name]
            assert variant.serves_gated_norm(128) and variant.serves_head_dims(128, 128)
            assert plan_name(name, True) in plans and name in plans
    # the gated_norm_only kernels are candidates here (the plain tuning leaves them out)
    assert FUSED_BF16 in spec.core_candidates("k_last", "bf16")
    assert FUSED_BF16 not in [
        spec.variant_name(v) for v in spec.tuning_candidates("k_last", "bf16")
    ]


@pytest.mark.parametrize(
    "core, message",
    [
        ({"pairs": ["k_last/bf8"]}, "core.pairs: expected layout/dtype"),
        ({"pairs": ["k_last/bf16"], "heads": [3]}, "tuning.core.heads: [3]"),
        ({"pairs": ["k_last/bf16"], "conv_width": 5}, "tuning.core.conv_width: 5"),
        ({"pairs": ["k_last/bf16"], "tokens": [9]}, "tuning.core.tokens: [9]"),
        ({"pairs": []}, "pairs"),
    ],
)
def test_a_bad_core_grid_is_refused_naming_it(core, message):
    data = h200_dict()
    data["tuning"]["core"] = core
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(to_yaml(data), "specs/h200.yaml")


def test_core_rules_pick_plans_per_point_and_stop_at_the_largest_measured_T(spec):
    rules = core_rules(_core_cells(), (128, 128))
    bf16 = [r for r in rules if r.state_dtype == "bf16"]
    assert all(r.gated_norm and r.conv1d and r.intermediate == "any" for r in rules)
    assert {(r.tokens.lo, r.tokens.hi) for r in rules} == {(1, 1), (2, 3), (4, 4)}
    t1 = [r for r in bf16 if r.tokens.lo == 1]
    assert [(r.use, r.split_conv) for r in t1] == [(FUSED_BF16, False), (SPLIT_BF16, True)]
    assert t1[0].batch_heads.lo == 1 and t1[1].batch_heads.hi is None
    assert all(r.source.startswith("t:kl/bf16/K128V128/core/T") for r in bf16)
    fp32 = [r for r in rules if r.state_dtype == "fp32"]
    assert {(r.use, r.split_conv) for r in fp32} == {(FUSED_FP32, False)}


def test_a_table_with_core_cells_starts_with_their_rules(spec):
    measured = Measured(name="specs/h200.tuning.h100.yaml", cells=tuple(_core_cells()))
    rules = dispatch_rules(spec, measured)
    plain = dispatch_rules(spec, None)
    # the spec's rules that hold PDL off for core calls, then the measured core rules
    held = [r for r in plain if r.conv1d and not r.pdl]
    core = [r for r in rules if r.source.startswith("t:")]
    assert held and rules[: len(held) + len(core)] == held + core
    assert rules[len(held) + len(core) :] == plain

    def shape(T, bh, conv1d=True, dtype="bf16", intermediate=False):
        return CallShape(
            layout="k_last", state_dtype=dtype, tokens=T, batch_heads=bh,
            intermediate=intermediate, head_dims=(128, 128), gated_norm=True, conv1d=conv1d,
        )  # fmt: skip

    big = select(rules, shape(2, 64 * 256))
    assert (big.use, big.split_conv) == (SPLIT_BF16, True)
    # at T = 1 from B*HV 1024 the spec holds PDL off on its kernel: the tune cannot rank that
    held_pdl = select(rules, shape(1, 64 * 256))
    assert held_pdl == select(plain, shape(1, 64 * 256)) and not held_pdl.pdl
    assert select(rules, shape(1, 32)).use == FUSED_BF16
    assert select(rules, shape(2, 64 * 256, intermediate=True)) == big  # vLLM's per-token form
    # past the largest measured T, without the prologue, another pair: the spec's
    for other in (shape(5, 64), shape(1, 64, conv1d=False), shape(1, 64, dtype="fp16")):
        assert select(rules, other) == select(plain, other)


def test_dispatch_py_writes_each_tables_core_rules_before_ahead(spec):
    from gdngen.tune.tuning_file import load_other_tunings  # noqa: F401 (the emit's path)

    measured = Measured(name="specs/h200.tuning.h100.yaml", cells=tuple(_core_cells()))
    files = dispatch_files(spec, "specs/h200.yaml", None, {"H100": measured})
    text = render(files[0])
    namespace: dict = {}
    exec(text, namespace)
    h100, default = namespace["TABLES"]["H100"], namespace["TABLE"]
    lead = [r for r in h100 if r.conv1d and (r.source.startswith("t:") or not r.pdl)]
    lead = lead[: len(lead) - len([r for r in namespace["AHEAD"] if r.conv1d and not r.pdl])]
    assert h100[: len(lead)] == tuple(lead) and any(r.source.startswith("t:") for r in lead)
    assert h100[len(lead) : len(lead) + len(namespace["AHEAD"])] == namespace["AHEAD"]
    assert default[: len(namespace["AHEAD"])] == namespace["AHEAD"]
    assert '"H100": (' in text and "starts with their rules" in text


def test_core_cells_round_trip_and_go_stale_on_their_own(spec, tmp_path):
    tuning = _core_file(spec, _core_cells(tokens=(1,)))
    path = tmp_path / "h200.tuning.h100.yaml"
    text = dump_tuning(tuning)
    assert "k_last/bf16 core:" in text and "split:" in text
    path.write_text(text)
    loaded = load_tuning(path, spec, gpu="H100")
    assert not loaded.stale and len(loaded.cells) == len(tuning.cells)
    assert set(loaded.cells[0].times_us) == set(tuning.cells[0].times_us)
    # a core candidate is added (one the plain tuning does not time): the core set is stale,
    # the plain sets' hashes are not
    data = h200_dict()
    data["variants"].append(dict(ADDED_CORE_CANDIDATE))
    changed = parse_spec(to_yaml(data), "specs/h200.yaml")
    assert set(stale_pairs(tuning, changed)) == {"k_last/bf16 core"}
    plain = {k: v for k, v in variants_sha256(spec).items() if not k.endswith(" core")}
    assert plain == {k: v for k, v in variants_sha256(changed).items() if k in plain}
    assert variants_sha256(spec)["k_last/bf16 core"] != variants_sha256(changed)["k_last/bf16 core"]


def _cpu_core_set(tokens: int):
    """A core cell's input set on the CPU (what gdngen.measure.core_cell.core_inputs makes on a
    GPU), small: H = 2, K = V = 16, HV = 4, five sequences."""
    from gdngen.measure.core_cell import core_problem

    problem = core_problem(5, tokens, 4, "fp32", H=2, K=16, V=16)
    args = problem.make("cpu")
    gen = torch.Generator().manual_seed(tokens)
    D = 2 * 2 * 16 + 4 * 16
    slots = args["initial_state"].shape[0]
    s = dict(
        args=args,
        z=torch.randn(1, 5 * tokens, 4, 16, generator=gen).bfloat16(),
        norm_weight=torch.randn(16, generator=gen).bfloat16(),
        output=torch.empty(1, 5 * tokens, 4, 16, dtype=torch.bfloat16),
        conv_state=torch.randn(slots, 2 + tokens, D, generator=gen).bfloat16().transpose(1, 2),
        conv_weight=torch.randn(D, 4, generator=gen).bfloat16(),
        conv_bias=torch.randn(D, generator=gen).bfloat16(),
    )
    return problem, s


@pytest.mark.parametrize("tokens", [1, 3])
def test_the_core_check_passes_the_reference_and_fails_a_wrong_call(tokens):
    # gdngen.tune.core checks every plan with CoreCheck before timing it
    from gdngen.measure.core_cell import EPS, CoreCheck
    from gdngen.reference.core import reference_core_call
    from gdngen.tune.core import CORE_CHECK_TOL

    problem, s = _cpu_core_set(tokens)
    pool, conv_pool = s["args"]["initial_state"], s["conv_state"]
    before, conv_before = pool.clone(), conv_pool.clone()
    check = CoreCheck(s, problem)

    def reference(factor=1.0, **kwargs):
        ref = reference_core_call(
            dict(kwargs, initial_state=pool.clone(), conv_state=conv_pool.clone()),
            kwargs["z"], kwargs["norm_weight"], H=problem.H, K=problem.K, eps=EPS,
        )  # fmt: skip
        kwargs["output"].copy_((ref.output * factor).view(kwargs["output"].shape))
        pool.copy_(ref.pool)
        conv_pool.copy_(ref.conv_pool)

    assert check.error(reference) < CORE_CHECK_TOL
    assert check.error(lambda **kw: reference(1.1, **kw)) > 0.05
    assert torch.equal(pool, before) and torch.equal(conv_pool, conv_before)


@pytest.mark.parametrize("tokens", [1, 3])
def test_a_decode_cell_calls_in_vllms_all_decode_form(tokens):
    # vLLM's decode chain takes one token a row with no cu_seqlens; a cell calls gdn_decode so,
    # on views of the set's packed tensors, and the reference reads both forms alike.
    from gdngen.measure.core_cell import EPS, core_kwargs
    from gdngen.reference.core import reference_core_call

    problem, s = _cpu_core_set(tokens)
    kwargs = core_kwargs(s)
    if tokens > 1:  # verify: the packed form as it is
        assert kwargs["mixed_qkv"] is s["args"]["mixed_qkv"] and "cu_seqlens" in kwargs
        return
    assert "cu_seqlens" not in kwargs and "max_seqlen" not in kwargs
    assert kwargs["mixed_qkv"].shape == (5, s["args"]["mixed_qkv"].shape[-1])
    assert kwargs["z"].shape == (5, 4, 16) and kwargs["output"].shape == (5, 4, 16)
    assert kwargs["output"].data_ptr() == s["output"].data_ptr()
    packed = dict(s["args"], conv_state=s["conv_state"], conv_weight=s["conv_weight"],
                  conv_bias=s["conv_bias"])  # fmt: skip

    def reference(args, z):
        return reference_core_call(args, z, s["norm_weight"], H=2, K=16, eps=EPS)

    dense, packed = reference(kwargs, kwargs["z"]), reference(packed, s["z"])
    assert torch.equal(dense.output, packed.output) and torch.equal(dense.pool, packed.pool)
    assert torch.equal(dense.conv_pool, packed.conv_pool)


def test_the_evidence_names_each_rules_plan_and_the_rules_left_out():
    from pathlib import Path

    text = (Path(__file__).parent.parent / "generated/h200/dispatch_evidence.txt").read_text()
    # a measured core rule's row names its plan, as the tuning file does
    assert any(
        line.startswith("t:kl/fp32/K128V128/core/T1/") and "  steps:kl_fp32_" in line
        for line in text.splitlines()
    )
    # The held rule (bf16 T = 1, B*HV >= 1024, no PDL) goes first only where a GPU's cells did
    # not time its plan without PDL: the H100's, whose bf16 T = 1 rules from B*HV 4096 are
    # listed as left out of its table; the H200's cells timed it, so its TABLE leaves none out.
    table, gpu_tables = text.split('TABLES["H100"]', 1)
    assert "Measured, and left out of TABLE:" not in table
    rows, left = gpu_tables.split('Measured, and left out of TABLES["H100"]')
    left_out = [line.split()[0] for line in left.splitlines() if line.startswith("t:")]
    assert left_out and all(s.startswith("t:kl/bf16/K128V128/core/T1/bh") for s in left_out)
    assert all(int(s.split("/bh")[1].split("-")[0]) >= 1024 for s in left_out)
