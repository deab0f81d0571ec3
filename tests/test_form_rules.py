"""The h200 spec's dispatch rules for call forms the tuning does not time (CPU): vLLM's packed
tokens and its per-token slot table route past the kernels those forms slow, in every emitted
table, while dense rows keep the measured picks; the builds and the spec's checks follow."""

import pytest

import generated.h200 as h200
from gdngen.dispatch import CallShape, ahead_of_measured, select
from gdngen.runtime.forms import Form, compile_keys
from gdngen.spec import SpecError, load_spec, parse_spec
from tests.spec_helpers import SPEC_PATH, to_yaml

K128 = (128, 128)
SERVES_EVERY_FORM = "kl_bf16_tv64_ilp8_vec8_tpg16_sm90"
TABLES = {"default": h200.dispatch.TABLE, **h200.dispatch.TABLES}


def _shape(tokens, batch_heads, packed, per_token):
    return CallShape(
        "k_last", "bf16", tokens, batch_heads, True, K128, packed=packed, per_token_slots=per_token
    )


PACKED = (_shape(2, 32768, True, False), _shape(2, 5017, True, False))
PER_TOKEN = (_shape(8, 8192, True, True), _shape(8, 16384, False, True))


@pytest.mark.parametrize("gpu", list(TABLES))
def test_packed_and_per_token_calls_take_the_form_rules(gpu):
    # docs/perf/h100-2026-11-27-uniform-exact.md: packed tokens with a positional cache at T = 2
    # and the per-token table at T = 8, at large batch; the per-token table on a GPU model
    # whose tuning timed that form (its spec cells) takes the measured rules instead
    table = TABLES[gpu]
    timed_per_token = any(r.measured and r.per_token_slots for r in table)
    for shape in PACKED + ((), PER_TOKEN)[not timed_per_token]:
        rule = select(table, shape)
        assert rule.use == SERVES_EVERY_FORM, shape.describe()
        assert rule.source.startswith("spec["), rule.source
    if timed_per_token:
        for shape in PER_TOKEN:
            assert "/spec/T8/" in select(table, shape).source, shape.describe()


def test_measured_per_token_rules_go_before_the_spec_rules_for_that_form():
    table = h200.dispatch.TABLE  # the H200's: its tuning file has spec cells
    per_token = [i for i, r in enumerate(table) if r.measured and r.per_token_slots]
    first_static = next(i for i, r in enumerate(table) if not r.measured)
    assert per_token and max(per_token) < table.index(h200.dispatch.AHEAD[0])
    assert all(table[i].separate_writes is False for i in per_token), "timed on the read slots"
    # the conv1d rules held PDL off, and the measured core rules, go first
    assert first_static < min(per_token) and table[first_static].conv1d
    # the H100's tuning file has none: its per-token calls keep the spec's form rules
    assert not any(r.measured and r.per_token_slots for r in h200.dispatch.TABLES["H100"])


def test_every_table_starts_with_the_static_rules_ahead_of_the_measured_ones():
    ahead = h200.dispatch.AHEAD
    assert ahead and all(ahead_of_measured(rule) for rule in ahead)
    assert any(rule.names_form for rule in ahead) and any(rule.gated_norm for rule in ahead)
    for gpu, table in TABLES.items():
        # (a GPU model with measured decode-core cells puts their rules first, and the spec's
        # that hold PDL off for those calls: docs/design.md, "Tuning the decode core"; then
        # its measured per-token rules, from its tuning's spec cells)
        lead = 0
        while table[lead : lead + len(ahead)] != ahead:
            rule = table[lead]
            assert rule.conv1d or (rule.measured and rule.per_token_slots), (gpu, rule)
            lead += 1
        assert not any(ahead_of_measured(rule) for rule in table[lead + len(ahead) :]), gpu


def test_dense_rows_and_small_batches_keep_the_measured_picks():
    h100 = h200.dispatch.TABLES["H100"]

    def pick(shape):
        return select(h100, shape)

    for shape in (_shape(2, 32768, False, False), _shape(8, 8192, False, False),
                  _shape(8, 4096, True, True), _shape(2, 4096, True, False)):  # fmt: skip
        assert pick(shape).source.startswith("t:"), shape
    # the per-token table with packed tokens at T = 2 was timed within 2% of dense rows
    assert pick(_shape(2, 32768, True, True)).source.startswith("t:")


@pytest.mark.parametrize("gpu", list(TABLES))
def test_fp32_per_token_calls_at_t2_and_t3_take_the_preloading_tile(gpu):
    # docs/perf/h100-2026-11-27-held-state.md: HV 64, B = 1 (B*HV 64, the H100 grid's 56-78)
    table = TABLES[gpu]
    preloading = "kl_fp32_tv8_ilp2_vec4_tpg32_pre_sm90"

    def fp32(tokens, batch_heads, per_token):
        shape = CallShape("k_last", "fp32", tokens, batch_heads, True, K128, packed=True,
                          per_token_slots=per_token)  # fmt: skip
        return select(table, shape)

    for tokens in (2, 3):
        for batch_heads in (56, 64, 78):
            rule = fp32(tokens, batch_heads, True)
            if any(r.measured and r.per_token_slots for r in table):
                # a GPU model whose tuning timed the per-token form: its own pick there
                assert rule.source.startswith("t:kl/fp32/K128V128/spec/T2/"), rule.source
            else:
                assert rule.use == preloading, (tokens, batch_heads)
    # outside the cell, and for the other forms, the table's own picks
    for tokens, batch_heads, per_token in ((4, 64, True), (3, 128, True), (3, 48, True),
                                           (3, 64, False), (2, 64, False)):  # fmt: skip
        rule = fp32(tokens, batch_heads, per_token)
        assert not (rule.per_token_slots and not rule.measured), (tokens, batch_heads)


def test_builds_of_each_form_include_the_kernel_its_rules_pick():
    spec = load_spec(SPEC_PATH)
    geometry = [g for g in spec.geometries if g.HV == 64 and (g.K, g.V) == K128][:1]
    assert geometry, "the h200 spec serves a K = V = 128, HV = 64 geometry"

    def variants(form, tokens):
        keys = compile_keys(
            [h200.dispatch.TABLES["H100"]], arch=spec.sm, geometries=geometry,
            pairs=[("k_last", "bf16")], max_tokens=8, forms=[form],
        )  # fmt: skip
        return {k.variant for k in keys if k.tokens == tokens}

    spec_form = Form(mode="spec", index_dtype="int32", packed=True, null_slot=0)
    packed_verify = Form(mode="verify", index_dtype="int32", packed=True)
    dense_verify = Form(mode="verify", index_dtype="int32")
    assert SERVES_EVERY_FORM in variants(spec_form, 8)
    assert SERVES_EVERY_FORM in variants(packed_verify, 2)
    staged = "kl_bf16_tv128_ilp8_vec8_tpg16_staged_sm90"
    assert staged in variants(dense_verify, 8) and staged not in variants(spec_form, 8)


def test_a_per_token_rule_that_stores_no_token_states_is_refused():
    data = load_spec(SPEC_PATH).model_dump(mode="json", exclude_none=True)
    rule = {"layout": "k_last", "state_dtype": "bf16", "tokens": [8, 8], "batch_heads": [1, None],
            "intermediate": "no", "per_token_slots": True, "use": SERVES_EVERY_FORM}  # fmt: skip
    data["dispatch"] = [rule, *data["dispatch"]]
    with pytest.raises(SpecError, match=r"dispatch\[0\]\.per_token_slots: .* `intermediate: no`"):
        parse_spec(to_yaml(data), "specs/h200.yaml")
