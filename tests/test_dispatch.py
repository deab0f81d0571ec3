"""gdngen.runtime.dispatch.select over the committed table of generated.h200."""

import pytest

import generated.h200 as h200
from gdngen.runtime.dispatch import Row, select
from gdngen.spec import load_spec
from tests.spec_helpers import SPEC_PATH

TABLE = h200.dispatch.TABLE
BATCH_HEADS = [1, 2, 31, 32, 64, 255, 256, 257, 512, 1023, 1024, 1025, 2048, 4096, 32768, 10**7]
PREFIX = {"k_last": "kl", "v_last": "vl"}


@pytest.mark.parametrize(
    "layout,state_dtype", h200.INFO.served, ids=["/".join(p) for p in h200.INFO.served]
)
@pytest.mark.parametrize("intermediate", [False, True], ids=["decode", "verify"])
def test_every_served_call_has_a_row(layout, state_dtype, intermediate):
    for tokens in range(1, h200.INFO.max_tokens + 1):
        for batch_heads in BATCH_HEADS:
            row = select(
                TABLE, layout=layout, state_dtype=state_dtype, tokens=tokens,
                batch_heads=batch_heads, intermediate=intermediate,
            )  # fmt: skip
            assert (row.layout, row.state_dtype) == (layout, state_dtype)
            assert row.variant in h200.VARIANTS
            assert row.variant.startswith(f"{PREFIX[layout]}_{state_dtype}_")
            lo, hi = row.batch_heads
            assert lo <= batch_heads and (hi is None or batch_heads <= hi)
            assert row.intermediate in ("any", "yes" if intermediate else "no")


def test_rows_name_known_variants_and_cover_the_target():
    assert {row.variant for row in TABLE} <= set(h200.VARIANTS)
    assert {(row.layout, row.state_dtype) for row in TABLE} == set(h200.INFO.served)
    assert load_spec(SPEC_PATH).served == h200.INFO.served


def test_target_select_is_the_table_select():
    for batch_heads in BATCH_HEADS:
        kwargs = dict(
            layout="k_last",
            state_dtype="bf16",
            tokens=2,
            batch_heads=batch_heads,
            intermediate=True,
        )
        assert h200.select(**kwargs) == select(TABLE, **kwargs)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(layout="x_last"),
        dict(state_dtype="fp16"),
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
        select(TABLE, **kwargs)
    message = str(caught.value)
    assert message.startswith("no dispatch row serves")
    for name, value in overrides.items():
        assert f"{name}={value}" in message


def _row(variant, tokens=(1, None), batch_heads=(1, None), intermediate="any"):
    return Row("k_last", "bf16", tokens, batch_heads, intermediate, variant, "test")


def test_first_matching_row_wins():
    table = (
        _row("verify_small", batch_heads=(1, 100), intermediate="yes"),
        _row("t1_only", tokens=(1, 1)),
        _row("small", batch_heads=(1, 100)),
        _row("catch_all"),
    )

    def pick(tokens, batch_heads, intermediate):
        return select(
            table, layout="k_last", state_dtype="bf16", tokens=tokens, batch_heads=batch_heads,
            intermediate=intermediate,
        ).variant  # fmt: skip

    assert pick(1, 50, True) == "verify_small"
    assert pick(1, 50, False) == "t1_only"
    assert pick(2, 100, False) == "small"
    assert pick(2, 101, False) == "catch_all"
    assert pick(3, 101, True) == "catch_all"
    with pytest.raises(LookupError):
        select(
            table[:1],
            layout="k_last",
            state_dtype="bf16",
            tokens=1,
            batch_heads=50,
            intermediate=False,
        )
