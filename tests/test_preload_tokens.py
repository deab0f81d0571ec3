"""The preload_tokens knob, without a GPU: its name, its check, and that it only moves the token
inputs' loads (q, k, v rows and gates) from the solving loop to a loop of their own before it."""

from collections import Counter

import pytest

from gdngen.emit.shape import gates_in_token_loop_behind_slot_table, holds_state_behind_slot_table
from gdngen.spec.model import Variant
from tests.spec_helpers import changed_code_lines, kernel_text, variant_text

#: one stepwise variant per shape of the token loop: K-last, V-last, V-last with K splits
STEPWISE = {
    "k_last": dict(
        layout="k_last", state_dtype="fp32", tile_v=8, ilp=2, vec=4, threads_per_group=32
    ),
    "v_last": dict(
        layout="v_last", state_dtype="bf16", tile_v=16, ilp=8, vec=8, threads_per_group=16
    ),
    "v_last_k_splits": dict(
        layout="v_last", state_dtype="fp32", tile_v=128, ilp=4, vec=16, threads_per_group=1,
        k_splits=8,
    ),
}  # fmt: skip

#: what loads one token's inputs: its q, k and v rows and the a and b its gates come from
INPUT_LOADS = tuple(f"({x}[seq, token_at[t]," for x in "qkvab")

SOLVING_LOOP = "    norms = cute.make_rmem_tensor((3,), Float32)"


def test_name_and_summary():
    plain = Variant(**STEPWISE["k_last"])
    preloaded = Variant(**STEPWISE["k_last"], preload_tokens=True)
    assert preloaded.name_for("sm_90a") == "kl_fp32_tv8_ilp2_vec4_tpg32_pre_sm90"
    assert plain.name_for("sm_90a") == "kl_fp32_tv8_ilp2_vec4_tpg32_sm90"
    knobs = {**STEPWISE["k_last"], "preload_tokens": True}
    said = "every token's q, k, v and gates loaded before the first"
    assert said in " ".join(line.strip(" #") for line in variant_text(knobs).splitlines())
    assert said in kernel_text(knobs).split('"""')[1]  # the body's docstring


def test_staged_solve_refuses_it():
    staged = dict(
        layout="k_last", state_dtype="bf16", tile_v=128, ilp=4, row_passes=4, vec=8,
        threads_per_group=16, solve="staged",
    )  # fmt: skip
    with pytest.raises(ValueError, match="preload_tokens needs solve: stepwise"):
        Variant(**staged, preload_tokens=True)


@pytest.mark.parametrize("shape", list(STEPWISE))
def test_it_moves_the_token_loads_before_the_solving_loop_and_changes_nothing_else(shape):
    plain = kernel_text(STEPWISE[shape])
    preloaded = kernel_text({**STEPWISE[shape], "preload_tokens": True})

    # Plain: the q, k and v loads are inside the solving loop, and a and b's too but for the
    # conv1d prologue's block, which loads every token's gate inputs before its barrier.
    # Preloaded: every one of them comes before it, and the solving loop takes token t's values
    # from the lists.
    def loads_before_solving_loop(text: str) -> list[int]:
        head = text[: text.index(SOLVING_LOOP)]
        return [head.count(load) for load in INPUT_LOADS]

    assert loads_before_solving_loop(plain) == [0, 0, 0, 1, 1]
    assert loads_before_solving_loop(preloaded) == [1] * len(INPUT_LOADS)
    solving_loop = preloaded[preloaded.index(SOLVING_LOOP) :]
    assert not any(load in solving_loop for load in INPUT_LOADS)
    for name, listed in [("q_raw", "q"), ("k_raw", "k"), ("v_rows", "v"), ("g", "g")]:
        assert f"{name} = {listed}_tokens[t]" in solving_loop
    assert "beta = beta_tokens[t]" in solving_loop

    # Line for line (as multisets, so wherever a diff aligns the moved block): the preloaded
    # body drops only the conv prologue's own gate block (the preload loop loads those gates)
    # and the conv branch in the loop with the gates computed there (twice in the plain body:
    # on the prologue's gate inputs and on loads of their own, which token_gates makes); it
    # adds the lists, their appends, the loads' loop, the conv test in both loops, the gates'
    # loop, the per-token picks and the comment saying why.
    def code_lines(text: str) -> Counter:
        body = text.split('"""', 2)[2]
        return Counter(line.strip() for line in body.splitlines() if line.strip())

    dropped = code_lines(plain) - code_lines(preloaded)
    new = code_lines(preloaded) - code_lines(plain)
    # At ILP 2 a preloading kernel also holds a 16-bit state behind a per-token slot table
    # (holds_state_behind_slot_table; test_held_state_* below): its raw_state line and
    # the hold after the gates' loop, with their comments.
    holds = holds_state_behind_slot_table(Variant(**STEPWISE[shape], preload_tokens=True))
    held_dropped = ["raw_state = conv_state is not None and state.element_type.width < 32"]
    held_new = [
        "raw_state = (conv_state is not None or per_token_slots) and state.element_type.width < 32",
        "if cutlass.const_expr(raw_state and conv_state is None):",
        "hold_until_here(h_raw)",
    ]
    dropped_comments = Counter({line: n for line, n in dropped.items() if line.startswith("#")})
    # (the gates computed in the loop, four ways: shared by the warp from T = 3 (computed at
    # token 0, with PDL on loads of a and b made together, without PDL where token_gates makes
    # them) or every token's on every lane (the same two ways), black spreading the calls'
    # arguments over lines)
    assert dropped - dropped_comments == Counter(
        [
            "if cutlass.const_expr(conv_state is not None):",
            "if cutlass.const_expr(conv_state is not None):",
            "if cutlass.const_expr(share_gates):",
            "if cutlass.const_expr(t == 0):",
            *["if cutlass.const_expr(pdl):"] * 2,
            "a_raw = Float32(a[seq, gate_at, hv])",
            "b_raw = Float32(b[seq, gate_at, hv])",
            *["lane_g, lane_beta = token_gates("] * 2,
            "a_raw, b_raw, A, bias, gate_live, recovery.idle_tokens",
            *("a,", "b,", "A,", "bias,", "gate_live,", "recovery.idle_tokens,"),
            "at=(seq, gate_at, hv),",
            "warp_g, warp_beta = shared_gates(lane_g, lane_beta, T)",
            "g, beta = warp_g[t], warp_beta[t]",
            "a_raw = Float32(a[seq, token_at[t], hv])",
            "b_raw = Float32(b[seq, token_at[t], hv])",
            *["g, beta = token_gates("] * 2,
            "a_raw, b_raw, A, bias, token_live[t], recovery.idle_tokens",
            *("a,", "b,", "A,", "bias,", "token_live[t],", "recovery.idle_tokens,"),
            "at=(seq, token_at[t], hv),",
            *[")"] * 4,
            *["else:"] * 4,
            *(held_dropped if holds else []),
        ]
    ), dropped
    assert sum(dropped_comments.values()) == (5 if holds else 1), dropped_comments
    expected = Counter(
        [
            "for t in cutlass.range_constexpr(T):",
            "if cutlass.const_expr(conv_state is None):",
            "if cutlass.const_expr(conv_state is None):",
            # every token's a and b, below T = 3 (SHARED_GATES_FROM_T)
            "if cutlass.const_expr(not share_gates):",
            *(held_new if holds else []),
        ]
    )
    for name, listed in [("q_raw", "q"), ("k_raw", "k"), ("v_rows", "v"), ("g", "g"),
                         ("beta", "beta")]:  # fmt: skip
        expected.update(
            [
                f"{listed}_tokens = []",
                f"{listed}_tokens.append({name})",
                f"{name} = {listed}_tokens[t]",
            ]
        )
    comments = Counter({line: n for line, n in new.items() if line.startswith("#")})
    assert new - comments == expected, new - comments
    assert sum(comments.values()) == (13 if holds else 5), comments
    # and the diff a reviewer reads is that small: the moved loads (about 34 lines with the
    # conv prologue's shared-memory branch, shown as removed and added where difflib cannot
    # align them across the epilogue's T = 1 z load, which stays in the loop), the gates'
    # loop and the lists (and, held, the state's 13 lines), and the plain body's four ways to
    # the gates in the loop (shared by the warp or not, with and without PDL, 50 lines) that
    # preloading replaces
    assert len(changed_code_lines(plain, preloaded)) < (160 if holds else 145)


def test_every_load_comes_before_any_gate_arithmetic():
    """The preload loop issues every token's loads before the first gate is computed: the gates'
    branches would otherwise split the loads into a block a token (docs/design.md)."""
    preloaded = kernel_text({**STEPWISE["k_last"], "preload_tokens": True})
    solving = preloaded.index(SOLVING_LOOP)
    first_gate = preloaded.index("= token_gates(")
    assert first_gate < solving
    head = preloaded[:first_gate]
    assert all(head.count(load) == 1 for load in INPUT_LOADS)


@pytest.mark.parametrize("shape", list(STEPWISE))
def test_held_state_behind_a_slot_table_at_ilp_2_only(shape):
    """A 16-bit state is held in its own dtype behind a per-token slot table by the preloading
    stepwise kernels at ILP 2 alone (docs/perf/h100-2026-11-27-held-state.md): their code says so
    and holds it after the gates' loop; the others convert it where it is loaded, as before."""
    held = "raw_state = (conv_state is not None or per_token_slots)"
    for knobs in (STEPWISE[shape], {**STEPWISE[shape], "preload_tokens": True}):
        variant = Variant(**knobs)
        text = kernel_text(knobs)
        holds = variant.preload_tokens and variant.ilp <= 2
        assert holds_state_behind_slot_table(variant) == holds
        assert (held in text) == holds
        assert text.count("hold_until_here(h_raw)") == (2 if holds else 1)  # and the conv one's
    staged = Variant(layout="k_last", state_dtype="bf16", tile_v=128, ilp=2, vec=8,
                     threads_per_group=16, solve="staged")  # fmt: skip
    assert not holds_state_behind_slot_table(staged)


#: a preloading K-last kernel that converts its state at the load (ILP 4)
ILP4 = dict(layout="k_last", state_dtype="bf16", tile_v=16, ilp=4, vec=8, threads_per_group=16)


def test_gates_in_the_token_loop_behind_a_slot_table_where_the_state_is_not_held():
    """Behind a per-token slot table the preloading K-last kernels that do not hold the state
    (ILP > 2) compute each token's gates in the token loop, from the preloaded a and b
    (docs/perf/h100-2026-11-27-gates-in-loop.md); every other form, and every other kernel,
    computes them before the loop as before."""
    switch = "gates_in_loop = per_token_slots and conv_state is None"
    variant = Variant(**ILP4, preload_tokens=True)
    assert gates_in_token_loop_behind_slot_table(variant)
    assert not holds_state_behind_slot_table(variant)
    text = kernel_text({**ILP4, "preload_tokens": True})
    assert text.count(switch) == 1
    solving_loop = text[text.index(SOLVING_LOOP) :]
    # In the loop: the gates of the preloaded inputs where the switch holds, else the lists'.
    assert "if cutlass.const_expr(gates_in_loop):" in solving_loop
    assert "token_gates(\n                    a_tokens[t], b_tokens[t], A, bias" in solving_loop
    assert "g = g_tokens[t]" in solving_loop
    assert not any(load in solving_loop for load in INPUT_LOADS)
    # Before it: the gates' loop computes them only where the switch does not hold.
    head = text[: text.index(SOLVING_LOOP)]
    assert head.count("if cutlass.const_expr(not gates_in_loop):") == 1
    assert head.count("a_tokens[t], b_tokens[t], A, bias") == 1

    others = [STEPWISE["k_last"], *(dict(k, preload_tokens=True) for k in STEPWISE.values()), ILP4]
    for knobs in others:
        assert not gates_in_token_loop_behind_slot_table(Variant(**knobs)), knobs
        assert "gates_in_loop" not in kernel_text(knobs), knobs
