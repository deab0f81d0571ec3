"""The dispatch model (gdngen.dispatch): the one matcher, coverage, and the committed h200 table."""

import itertools
import random
from dataclasses import replace

import pytest

import generated.h200 as h200
from gdngen.dispatch import (
    CallShape,
    FirstMatch,
    Range,
    Rule,
    boundary_shapes,
    coverage_gap,
    reached,
    row,
    select,
)
from gdngen.dispatch.rules import CALL_FORMS, pool_forms
from gdngen.spec import load_spec
from tests.spec_helpers import ROOT, SPEC_PATH

TABLE = h200.dispatch.TABLE
SPEC = load_spec(SPEC_PATH)
HEAD_DIMS = sorted({(g.K, g.V) for g in h200.INFO.geometries})
K128 = (128, 128)
BATCH_HEADS = [1, 2, 31, 32, 64, 255, 256, 257, 512, 1023, 1024, 1025, 2048, 4096, 32768, 10**7]
PREFIX = {"k_last": "kl", "v_last": "vl"}


@pytest.mark.parametrize(
    "layout,state_dtype", h200.INFO.served, ids=["/".join(p) for p in h200.INFO.served]
)
@pytest.mark.parametrize("intermediate", [False, True], ids=["decode", "verify"])
@pytest.mark.parametrize("head_dims", HEAD_DIMS, ids=lambda d: f"K{d[0]}V{d[1]}")
def test_every_served_call_has_a_rule_and_a_kernel_of_its_head_dims(
    layout, state_dtype, intermediate, head_dims
):
    for tokens in range(1, h200.INFO.max_tokens + 1):
        for batch_heads in BATCH_HEADS:
            rule = h200.select(
                layout=layout, state_dtype=state_dtype, tokens=tokens,
                batch_heads=batch_heads, intermediate=intermediate, head_dims=head_dims,
            )  # fmt: skip
            assert (rule.layout, rule.state_dtype) == (layout, state_dtype)
            assert rule.use in h200.VARIANTS
            assert rule.use.startswith(f"{PREFIX[layout]}_{state_dtype}_")
            assert rule.batch_heads.contains(batch_heads) and rule.tokens.contains(tokens)
            assert rule.intermediate in ("any", "yes" if intermediate else "no")
            assert rule.head_dims in (None, head_dims)
            assert SPEC.variants_by_name[rule.use].serves_head_dims(*head_dims), rule.use
            assert rule.source  # every emitted rule cites a spec rule or a measurement


def test_the_target_serves_head_dims_64_128_and_256():
    assert HEAD_DIMS == [(64, 64), (128, 128), (256, 256)]
    # the measured rules are for the head dims they were measured at, the static ones say theirs
    assert all(rule.head_dims is not None for rule in TABLE)
    # and the tuning grid measures every head dims (tuning.head_dims in specs/h200.yaml)
    assert {rule.head_dims for rule in TABLE if rule.source.startswith("t:")} == set(HEAD_DIMS)


def test_rules_name_known_variants_and_cover_the_target():
    assert {rule.use for rule in TABLE} <= set(h200.VARIANTS)
    assert {(rule.layout, rule.state_dtype) for rule in TABLE} == set(h200.INFO.served)
    assert load_spec(SPEC_PATH).served == h200.INFO.served
    # calls with and without the gated RMSNorm epilogue (the target has the feature)
    assert h200.INFO.gated_rmsnorm
    fusions = ((False, False), (True, False), (True, True))
    assert coverage_gap(TABLE, h200.INFO.served, HEAD_DIMS, h200.INFO.max_tokens, fusions) is None
    # and no rule is dead weight: each is the first match of some call
    assert reached(TABLE, h200.INFO.served, HEAD_DIMS, h200.INFO.max_tokens, fusions) == list(TABLE)
    # the epilogue's rules come first (after the measured per-token rules, which route calls
    # without it alone) and route no call without it
    first = [rule.gated_norm for rule in TABLE if not (rule.measured and rule.per_token_slots)]
    assert all(rule.gated_norm is False for rule in TABLE if rule.per_token_slots and rule.measured)
    assert first == sorted(first, key=lambda norm: not norm)
    plain = reached(TABLE, h200.INFO.served, HEAD_DIMS, h200.INFO.max_tokens)
    assert not any(rule.gated_norm for rule in plain)


def test_the_committed_tables_are_a_rule_a_line():
    """generated/h200/dispatch.py writes each rule of each table on a line of its own (rows
    whose first match wins, in table order), which reads back as that rule."""
    text = (ROOT / "generated" / "h200" / "dispatch.py").read_text()
    lines = [line.strip() for line in text.splitlines() if line.lstrip().startswith("row(")]
    ahead = h200.dispatch.AHEAD
    tables = [TABLE, *h200.dispatch.TABLES.values()]
    rules = [*ahead]
    for table in tables:
        # a table of a GPU model with measured decode-core cells starts with their rules (and
        # the spec's that hold PDL off for such calls), and with measured per-token cells, with
        # theirs; then AHEAD
        at = next(i for i in range(len(table)) if table[i : i + len(ahead)] == ahead)
        lead = table[:at]
        assert all(
            (r.conv1d and (r.measured or not r.pdl)) or (r.measured and r.per_token_slots)
            for r in lead
        )
        rules += [*lead, *table[at + len(ahead) :]]
    assert [eval(line.removesuffix(","), {"row": row}) for line in lines] == rules


def test_norm_calls_land_on_kernels_with_the_epilogue():
    spec = load_spec(SPEC_PATH)
    variants = {spec.variant_name(v): v for v in spec.variants}
    for layout, state_dtype in h200.INFO.served:
        for head_dims in HEAD_DIMS:
            for batch_heads in BATCH_HEADS:
                for tokens in (1, 4, 8):
                    rule = select(
                        TABLE,
                        CallShape(layout, state_dtype, tokens, batch_heads, False, head_dims, True),
                    )
                    assert variants[rule.use].serves_gated_norm(head_dims[1]), rule


def test_target_select_is_the_table_select():
    for head_dims in HEAD_DIMS:
        for batch_heads in BATCH_HEADS:
            shape = CallShape("k_last", "bf16", 2, batch_heads, True, head_dims)
            assert h200.select(
                layout="k_last", state_dtype="bf16", tokens=2, batch_heads=batch_heads,
                intermediate=True, head_dims=head_dims,
            ) is select(TABLE, shape)  # fmt: skip


@pytest.mark.parametrize(
    "overrides",
    [
        dict(layout="x_last"),
        dict(state_dtype="fp64"),
        dict(tokens=h200.INFO.max_tokens + 1),
        dict(tokens=0),
        dict(batch_heads=0),
        dict(head_dims=(64, 128)),
    ],
    ids=["layout", "dtype", "too_many_tokens", "no_tokens", "no_heads", "head_dims"],
)
def test_unserved_call_raises_lookup_error(overrides):
    kwargs = dict(
        layout="k_last", state_dtype="bf16", tokens=1, batch_heads=64, intermediate=False,
        head_dims=K128,
    )  # fmt: skip
    kwargs.update(overrides)
    with pytest.raises(LookupError) as caught:
        h200.select(**kwargs)
    message = str(caught.value)
    assert message.startswith("target h200: no dispatch rule serves")
    for name, value in overrides.items():
        shown = f"K{value[0]}xV{value[1]}" if name == "head_dims" else value
        assert f"{name}={shown}" in message


def _rule(use, tokens=(1, None), batch_heads=(1, None), intermediate="any", head_dims=None):
    return Rule(
        layout="k_last", state_dtype="bf16", tokens=Range(*tokens),
        batch_heads=Range(*batch_heads), intermediate=intermediate, head_dims=head_dims, use=use,
    )  # fmt: skip


def test_first_matching_rule_wins():
    table = (
        _rule("verify_small", batch_heads=(1, 100), intermediate="yes"),
        _rule("t1_only", tokens=(1, 1)),
        _rule("small", batch_heads=(1, 100)),
        _rule("catch_all"),
    )

    def pick(tokens, batch_heads, intermediate):
        return select(
            table, CallShape("k_last", "bf16", tokens, batch_heads, intermediate, K128)
        ).use

    assert pick(1, 50, True) == "verify_small"
    assert pick(1, 50, False) == "t1_only"
    assert pick(2, 100, False) == "small"
    assert pick(2, 101, False) == "catch_all"
    assert pick(3, 101, True) == "catch_all"
    assert select(table[:1], CallShape("k_last", "bf16", 1, 50, False, K128)) is None


def test_a_rule_with_head_dims_serves_only_calls_of_those():
    table = (_rule("k64", head_dims=(64, 64)), _rule("any_k"))

    def pick(head_dims):
        return select(table, CallShape("k_last", "bf16", 1, 8, False, head_dims)).use

    assert pick((64, 64)) == "k64"
    assert pick((128, 128)) == pick((64, 128)) == pick((256, 256)) == "any_k"
    assert reached(table, [("k_last", "bf16")], [K128], 2) == [table[1]]  # k64 is dead here
    assert reached(table, [("k_last", "bf16")], [(64, 64), K128], 2) == list(table)


def test_a_rule_that_names_a_call_form_serves_only_calls_of_it():
    table = (
        replace(_rule("spec"), per_token_slots=True),
        replace(_rule("packed"), packed=True),
        _rule("dense"),
    )

    def pick(packed, per_token):
        shape = CallShape(
            "k_last", "bf16", 2, 8, True, K128, packed=packed, per_token_slots=per_token
        )
        return select(table, shape).use

    assert [pick(False, False), pick(True, False), pick(False, True), pick(True, True)] == [
        "dense", "packed", "spec", "spec",
    ]  # fmt: skip
    # with a form named, coverage and reach look at every form, not at dense rows alone
    assert reached(table, [("k_last", "bf16")], [K128], 2) == list(table)
    assert reached(table[2:], [("k_last", "bf16")], [K128], 2) == [table[2]]
    gap = coverage_gap(table[:2], [("k_last", "bf16")], [K128], 2)
    assert gap == CallShape("k_last", "bf16", 1, 1, False, K128)
    gap = coverage_gap(
        (table[0], _rule("dense_only", intermediate="no")), [("k_last", "bf16")], [K128], 2
    )
    assert gap == CallShape("k_last", "bf16", 1, 1, True, K128, packed=False, per_token_slots=False)
    assert gap.describe().endswith("intermediate=yes head_dims=K128xV128")


def test_coverage_gap_names_the_first_unserved_shape():
    pairs = [("k_last", "bf16")]
    covered = [_rule("small", batch_heads=(1, 100)), _rule("large", batch_heads=(101, None))]
    assert coverage_gap(covered, pairs, [K128], 4) is None
    # a hole between two ranges
    gap = coverage_gap(
        [_rule("small", batch_heads=(1, 100)), _rule("large", (1, None), (102, None))],
        pairs,
        [K128],
        4,
    )
    assert gap == CallShape("k_last", "bf16", 1, 101, False, K128)
    # only T = 1..2 covered
    gap = coverage_gap([_rule("t12", tokens=(1, 2))], pairs, [K128], 4)
    assert gap == CallShape("k_last", "bf16", 3, 1, False, K128)
    # verify calls not covered
    gap = coverage_gap([_rule("decode", intermediate="no")], pairs, [K128], 2)
    assert gap == CallShape("k_last", "bf16", 1, 1, True, K128)
    assert gap.describe() == (
        "layout=k_last state_dtype=bf16 tokens=1 batch_heads=1 intermediate=yes "
        "head_dims=K128xV128"
    )
    # rules for K = V = 128 only leave the other head dims of the target uncovered
    gap = coverage_gap([_rule("k128", head_dims=K128)], pairs, [K128, (256, 256)], 2)
    assert gap == CallShape("k_last", "bf16", 1, 1, False, (256, 256))


PAIRS = [("k_last", "bf16"), ("v_last", "fp32")]
FUSIONS = ((False, False), (True, False), (True, True))


def _random_rule(rng: random.Random, index: int) -> Rule:
    """A rule with random conditions on every field a call shape has (ranges that overlap)."""

    def span(top):
        lo = rng.randint(1, top)
        return Range(lo, rng.choice([None, rng.randint(lo, top + 2)]))

    return Rule(
        layout=PAIRS[index % 2][0], state_dtype=PAIRS[index % 2][1],
        tokens=span(4), batch_heads=span(30), intermediate=rng.choice(["any", "yes", "no"]),
        head_dims=rng.choice([None, K128, (64, 64)]), gated_norm=rng.choice([None, False, True]),
        conv1d=rng.choice([None, False, True]), heads=rng.choice([None, None, span(12)]),
        packed=rng.choice([None, None, None, False, True]),
        per_token_slots=rng.choice([None, None, None, False, True]), use=f"r{index}",
    )  # fmt: skip


def _every_shape(max_tokens=4, batch_heads=33, heads=15):
    """Every call shape of the random tables' space, sizes included (the brute force): past
    batch*heads 33 and HV 15 (one past every random range's end) no first match changes."""
    for (layout, dtype), dims, (norm, conv), tokens, intermediate, form, bh, hv in (
        itertools.product(
            PAIRS, [K128, (64, 64)], FUSIONS, range(1, max_tokens + 1), (False, True), CALL_FORMS,
            range(1, batch_heads + 1), [None, *range(1, heads + 1)],
        )
    ):  # fmt: skip
        if form[1] and not intermediate:
            continue  # a per-token table stores every token's state
        yield CallShape(layout, dtype, tokens, bh, intermediate, dims, norm, conv, hv, *form)


def test_a_rule_for_separate_writes_serves_only_calls_that_write_elsewhere():
    table = (replace(_rule("apart"), separate_writes=True), _rule("any"))

    def pick(separate, per_token=False):
        shape = CallShape(
            "k_last", "bf16", 2, 8, True, K128, per_token_slots=per_token,
            separate_writes=separate,
        )  # fmt: skip
        return select(table, shape).use

    assert [pick(False), pick(True), pick(True, per_token=True)] == ["any", "apart", "apart"]
    assert (
        "separate_writes=yes"
        in CallShape("k_last", "bf16", 1, 8, False, K128, separate_writes=True).describe()
    )
    # coverage and reach look at calls with and without separate writes
    assert reached(table, [("k_last", "bf16")], [K128], 2) == list(table)
    gap = coverage_gap(table[:1], [("k_last", "bf16")], [K128], 2)
    assert gap == CallShape("k_last", "bf16", 1, 1, False, K128)


def test_pool_forms_both_ways_only_where_a_rule_names_them():
    assert pool_forms([_rule("any")]) == [{}]
    apart = replace(_rule("apart"), separate_writes=True)
    strided = replace(_rule("strided"), strided_state=False)
    assert pool_forms([apart]) == [{"separate_writes": False}, {"separate_writes": True}]
    assert len(pool_forms([apart, strided])) == 4
    shape = CallShape("k_last", "bf16", 1, 8, False, K128, strided_state=True)
    assert select((replace(_rule("dense"), strided_state=False), _rule("any")), shape).use == "any"
    assert "strided_state=yes" in shape.describe()


def test_a_strided_fp32_pool_takes_its_rule_on_an_h100():
    common = dict(
        layout="k_last", state_dtype="fp32", tokens=1, intermediate=False, head_dims=K128,
        gpu="NVIDIA H100 80GB HBM3",
    )  # fmt: skip
    for batch_heads in (512, 1024):
        rule = h200.select(batch_heads=batch_heads, heads=64, strided_state=True, **common)
        assert rule.use == "kl_fp32_tv16_ilp8_vec4_tpg32_sm90" and rule.strided_state
    dense = h200.select(batch_heads=1024, heads=64, **common)
    assert dense.strided_state is None and dense.use != "kl_fp32_tv16_ilp8_vec4_tpg32_sm90"
    assert (
        h200.select(batch_heads=2048, heads=64, strided_state=True, **common).strided_state is None
    )


def test_the_committed_table_sends_flashinfers_separate_writes_to_their_rules():
    """FlashInfer's output_state_indices at T = 1 and its per-token scatter at T = 4, from
    B*HV 4096, take the rules measured against FlashInfer's kernel; the same calls writing the
    slots they read keep the tuned ones."""
    common = dict(
        layout="k_last", state_dtype="bf16", head_dims=K128, heads=64, gpu="NVIDIA H100 80GB HBM3"
    )
    update = h200.select(
        tokens=1, batch_heads=4096, intermediate=False, separate_writes=True, **common
    )
    assert update.use.endswith("passes4_pf_unroll_staged_sm90") and update.separate_writes
    scatter = h200.select(
        tokens=4, batch_heads=16384, intermediate=True, per_token_slots=True,
        separate_writes=True, **common,
    )  # fmt: skip
    assert scatter.use == "kl_bf16_tv64_ilp8_vec8_tpg16_staged_sm90"
    in_place = h200.select(tokens=1, batch_heads=4096, intermediate=False, **common)
    assert in_place.separate_writes is None and in_place is not update


@pytest.mark.parametrize("seed", range(6))
def test_first_match_boundaries_coverage_and_reach_agree_with_brute_force(seed):
    # FirstMatch is select; the boundary shapes (points taken per kind of call and T) meet every
    # first-match outcome there is; coverage_gap names the first gap of the whole space (in the
    # enumeration's order) and reached the rules some call reaches, as over every shape.
    rng = random.Random(seed)
    rules = [_random_rule(rng, i) for i in range(rng.randint(3, 14))]
    first_match = FirstMatch(rules)
    every = list(_every_shape())
    outcomes = {}
    for shape in every:
        rule = select(rules, shape)
        assert first_match(shape) is rule
        outcomes.setdefault(id(rule), shape)
    args = (PAIRS, [K128, (64, 64)], 4, FUSIONS)
    seen = {id(first_match(shape)) for shape in boundary_shapes(rules, *args)}
    assert seen == set(outcomes)
    assert reached(rules, *args) == [r for r in rules if id(r) in outcomes]
    gaps = [shape for shape in every if first_match(shape) is None]
    gap = coverage_gap(rules, *args)
    if not gaps:
        assert gap is None
    else:  # the first gap of the space in (kind, T, batch*heads, HV) order, None HV first
        order = lambda c: (  # noqa: E731
            PAIRS.index((c.layout, c.state_dtype)), [K128, (64, 64)].index(c.head_dims),
            FUSIONS.index((c.gated_norm, c.conv1d)), c.tokens, c.intermediate,
            CALL_FORMS.index((c.packed, c.per_token_slots)), c.batch_heads,
            -1 if c.heads is None else c.heads,
        )  # fmt: skip
        assert gap == min(gaps, key=order)


def test_first_match_is_select_over_the_committed_tables():
    rng = random.Random(11)
    kinds = list(itertools.product(h200.INFO.served, HEAD_DIMS, FUSIONS, (False, True)))
    for table in (TABLE, *h200.dispatch.TABLES.values()):
        first_match = FirstMatch(table)
        for _ in range(1500):
            (layout, dtype), dims, (norm, conv), intermediate = rng.choice(kinds)
            packed, per_token = rng.choice(CALL_FORMS if intermediate else CALL_FORMS[:2])
            shape = CallShape(
                layout, dtype, rng.randint(1, 9), rng.choice([rng.randint(1, 5000), *BATCH_HEADS]),
                intermediate, dims, norm, conv, rng.choice([None, 4, 6, 16, 24, 32, 48, 64, 80]),
                packed, per_token,
            )  # fmt: skip
            assert first_match(shape) is select(table, shape)
