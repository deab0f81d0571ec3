"""The dispatch model (gdngen.dispatch): the one matcher, coverage, and the committed h200 table."""

import pytest

import generated.h200 as h200
from gdngen.dispatch import CallShape, Range, Rule, coverage_gap, select
from gdngen.spec import load_spec
from tests.spec_helpers import SPEC_PATH

TABLE = h200.dispatch.TABLE
BATCH_HEADS = [1, 2, 31, 32, 64, 255, 256, 257, 512, 1023, 1024, 1025, 2048, 4096, 32768, 10**7]
PREFIX = {"k_last": "kl", "v_last": "vl"}


@pytest.mark.parametrize(
    "layout,state_dtype", h200.INFO.served, ids=["/".join(p) for p in h200.INFO.served]
)
@pytest.mark.parametrize("intermediate", [False, True], ids=["decode", "verify"])
def test_every_served_call_has_a_rule(layout, state_dtype, intermediate):
    for tokens in range(1, h200.INFO.max_tokens + 1):
        for batch_heads in BATCH_HEADS:
            rule = h200.select(
                layout=layout, state_dtype=state_dtype, tokens=tokens,
                batch_heads=batch_heads, intermediate=intermediate,
            )  # fmt: skip
            assert (rule.layout, rule.state_dtype) == (layout, state_dtype)
            assert rule.use in h200.VARIANTS
            assert rule.use.startswith(f"{PREFIX[layout]}_{state_dtype}_")
            assert rule.batch_heads.contains(batch_heads) and rule.tokens.contains(tokens)
            assert rule.intermediate in ("any", "yes" if intermediate else "no")
            assert rule.source  # every emitted rule cites a spec rule or a measurement


def test_rules_name_known_variants_and_cover_the_target():
    assert {rule.use for rule in TABLE} <= set(h200.VARIANTS)
    assert {(rule.layout, rule.state_dtype) for rule in TABLE} == set(h200.INFO.served)
    assert load_spec(SPEC_PATH).served == h200.INFO.served
    assert coverage_gap(TABLE, h200.INFO.served, h200.INFO.max_tokens) is None


def test_target_select_is_the_table_select():
    for batch_heads in BATCH_HEADS:
        shape = CallShape("k_last", "bf16", 2, batch_heads, True)
        assert h200.select(
            layout="k_last", state_dtype="bf16", tokens=2, batch_heads=batch_heads,
            intermediate=True,
        ) is select(TABLE, shape)  # fmt: skip


@pytest.mark.parametrize(
    "overrides",
    [
        dict(layout="x_last"),
        dict(state_dtype="fp64"),
        dict(tokens=h200.INFO.max_tokens + 1),
        dict(tokens=0),
        dict(batch_heads=0),
    ],
    ids=["layout", "dtype", "too_many_tokens", "no_tokens", "no_heads"],
)
def test_unserved_call_raises_lookup_error(overrides):
    kwargs = dict(layout="k_last", state_dtype="bf16", tokens=1, batch_heads=64, intermediate=False)
    kwargs.update(overrides)
    with pytest.raises(LookupError) as caught:
        h200.select(**kwargs)
    message = str(caught.value)
    assert message.startswith("target h200: no dispatch rule serves")
    for name, value in overrides.items():
        assert f"{name}={value}" in message


def _rule(use, tokens=(1, None), batch_heads=(1, None), intermediate="any"):
    return Rule(
        layout="k_last", state_dtype="bf16", tokens=tokens, batch_heads=batch_heads,
        intermediate=intermediate, use=use,
    )  # fmt: skip


def test_first_matching_rule_wins():
    table = (
        _rule("verify_small", batch_heads=(1, 100), intermediate="yes"),
        _rule("t1_only", tokens=(1, 1)),
        _rule("small", batch_heads=(1, 100)),
        _rule("catch_all"),
    )

    def pick(tokens, batch_heads, intermediate):
        return select(table, CallShape("k_last", "bf16", tokens, batch_heads, intermediate)).use

    assert pick(1, 50, True) == "verify_small"
    assert pick(1, 50, False) == "t1_only"
    assert pick(2, 100, False) == "small"
    assert pick(2, 101, False) == "catch_all"
    assert pick(3, 101, True) == "catch_all"
    assert select(table[:1], CallShape("k_last", "bf16", 1, 50, False)) is None


def test_coverage_gap_names_the_first_unserved_shape():
    pairs = [("k_last", "bf16")]
    covered = [_rule("small", batch_heads=(1, 100)), _rule("large", batch_heads=(101, None))]
    assert coverage_gap(covered, pairs, 4) is None
    # a hole between two ranges
    gap = coverage_gap([_rule("small", batch_heads=(1, 100)), _rule("large", (1, None), (102, None))], pairs, 4)
    assert gap == CallShape("k_last", "bf16", 1, 101, False)
    # only T = 1..2 covered
    gap = coverage_gap([_rule("t12", tokens=(1, 2))], pairs, 4)
    assert gap == CallShape("k_last", "bf16", 3, 1, False)
    # verify calls not covered
    gap = coverage_gap([_rule("decode", intermediate="no")], pairs, 2)
    assert gap == CallShape("k_last", "bf16", 1, 1, True)
    assert gap.describe() == (
        "layout=k_last state_dtype=bf16 tokens=1 batch_heads=1 intermediate=yes"
    )


@pytest.mark.parametrize(
    "text,expected",
    [(3, (3, 3)), ([2, 8], (2, 8)), ([257, None], (257, None)), ({"lo": 2, "hi": 8}, (2, 8))],
)
def test_range_shorthands(text, expected):
    parsed = Range.model_validate(text)
    assert (parsed.lo, parsed.hi) == expected


@pytest.mark.parametrize("text", [[8, 2], [1, 2, 3], [0, 4]])
def test_bad_ranges_are_refused(text):
    with pytest.raises(ValueError):
        Range.model_validate(text)
