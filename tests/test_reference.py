"""gdngen.reference.reference_decode against a naive loop-by-loop float64 implementation of
docs/design.md ("The math") written here (per batch row, token, value head, row r and column c)."""

import math

import numpy as np
import pytest
import torch

from gdngen.problem import Problem
from gdngen.reference import reference_decode, softplus

RTOL = 1e-12
SMALL = dict(batch=3, tokens=3, H=2, HV=4, K=8, V=6)


def naive_softplus(x: float) -> float:
    return x if x > 20.0 else math.log1p(math.exp(x))


def naive_sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def naive_decode(args: dict, pool: torch.Tensor) -> dict:
    """Returns output [B,T,HV,V], the pool after the call, and per live row the final state and
    every token's state, all as float64 numpy (states K-last [V][K])."""
    q, k, v = (args[n].double().numpy() for n in ("q", "k", "v"))
    a, b = args["a"].double().numpy(), args["b"].double().numpy()
    A_log, dt_bias = args["A_log"].double().numpy(), args["dt_bias"].double().numpy()
    P = pool.double().numpy()
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    v_last = args["state_layout"] == "v_last"
    scale = K**-0.5 if args["scale"] is None else args["scale"]
    reads = args.get("initial_state_indices")
    writes = args.get("output_state_indices")

    out = np.zeros((B, T, HV, V))
    new_pool = P.copy()
    states, finals, live_rows = {}, {}, []
    for n in range(B):
        read = n if reads is None else int(reads[n])
        write = read if writes is None else int(writes[n])
        if read < 0:
            continue  # padded row: zero output, no slot read or written
        live_rows.append(n)
        for hv in range(HV):
            head = hv // (HV // H)
            h = [
                [P[read, hv, c, r] if v_last else P[read, hv, r, c] for c in range(K)]
                for r in range(V)
            ]
            for t in range(T):
                x = a[n, t, hv] + dt_bias[hv]
                g = math.exp(-math.exp(A_log[hv]) * naive_softplus(x))
                beta = naive_sigmoid(b[n, t, hv])
                qv = [q[n, t, head, c] for c in range(K)]
                kv = [k[n, t, head, c] for c in range(K)]
                if args["use_qk_l2norm"]:
                    qn = 1.0 / math.sqrt(sum(x * x for x in qv) + 1e-6)
                    kn = 1.0 / math.sqrt(sum(x * x for x in kv) + 1e-6)
                    qv = [x * qn for x in qv]
                    kv = [x * kn for x in kv]
                qv = [x * scale for x in qv]
                for r in range(V):
                    for c in range(K):
                        h[r][c] *= g
                for r in range(V):
                    hk = sum(h[r][c] * kv[c] for c in range(K))
                    u = beta * (v[n, t, hv, r] - hk)
                    for c in range(K):
                        h[r][c] += u * kv[c]
                for r in range(V):
                    out[n, t, hv, r] = sum(h[r][c] * qv[c] for c in range(K))
                states[n, t, hv] = np.array(h)
            finals[n, hv] = np.array(h)
            if not args["disable_state_update"] and write >= 0:  # a negative write: no store
                new_pool[write, hv] = np.array(h).T if v_last else np.array(h)
    return dict(
        output=out,
        pool=new_pool,
        live=live_rows,
        final=np.array([[finals[n, hv] for hv in range(HV)] for n in live_rows]),
        states=np.array(
            [[[states[n, t, hv] for hv in range(HV)] for t in range(T)] for n in live_rows]
        ),
    )


def assert_close(name: str, got, want) -> None:
    got = got.numpy() if isinstance(got, torch.Tensor) else got
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), f"{name}: not finite"
    peak = max(np.abs(want).max(), 1e-300)
    worst = np.abs(got - want).max()
    assert worst <= RTOL * peak, f"{name}: max error {worst:.3g} > {RTOL:g} * {peak:.3g}"


def run_both(args: dict, pool: torch.Tensor):
    ref = reference_decode(
        args["q"], args["k"], args["v"], pool, args["A_log"], args["a"], args["dt_bias"], args["b"],
        scale=args["scale"], use_qk_l2norm=args["use_qk_l2norm"],
        read_slots=args.get("initial_state_indices"), write_slots=args.get("output_state_indices"),
        disable_state_update=args["disable_state_update"], state_layout=args["state_layout"],
    )  # fmt: skip
    return ref, naive_decode(args, pool)


def compare(ref, naive, pool_before: torch.Tensor) -> None:
    live = naive["live"]
    assert ref.live.tolist() == [n in live for n in range(ref.live.numel())]
    assert_close("output", ref.output, naive["output"])
    assert_close("final state", ref.final_state[live], naive["final"])
    assert_close("intermediate states", ref.intermediates[live], naive["states"])
    assert ref.pool.dtype == pool_before.dtype
    assert_close("pool", ref.pool.double(), naive["pool"])


# fmt: off
CASES = {
    "k_last_dense": dict(),
    "v_last_dense": dict(layout="v_last"),
    "no_l2norm_custom_scale": dict(use_qk_l2norm=False, scale=0.3),
    "l2norm_custom_scale_v_last": dict(layout="v_last", scale=1.7),
    "pool_read_write_slots_padded": dict(pool_size=9, separate_write_slots=True, padded_rows=(1,), index_dtype="int64"),
    "pool_shared_slots_padded_v_last": dict(layout="v_last", pool_size=5, padded_rows=(0, 2)),
    "disable_state_update": dict(pool_size=4, disable_state_update=True),
    "t1": dict(tokens=1, layout="v_last", pool_size=3),
    "t5_fp32_gates": dict(tokens=5, gate_dtype="fp32", dt_bias_dtype="bf16", io_dtype="fp16"),
}
# fmt: on


@pytest.mark.parametrize("fields", list(CASES.values()), ids=list(CASES))
def test_reference_matches_naive(fields):
    problem = Problem(**{**SMALL, **fields}, seed=len(fields) + 7)
    args = problem.make("cpu")
    pool = (args["state"] if args["state"] is not None else args["initial_state"]).double()
    ref, naive = run_both(args, pool)
    compare(ref, naive, pool)
    if problem.padded_rows:
        assert (ref.output[list(problem.padded_rows)] == 0).all()
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    if not problem.disable_state_update:
        slots = args.get("output_state_indices", args.get("initial_state_indices"))
        writes = torch.arange(problem.batch) if slots is None else slots.long()
        untouched[writes[writes >= 0]] = False
    assert torch.equal(ref.pool[untouched], pool[untouched]), "a slot no live row writes changed"


def test_negative_write_slot_computes_the_row_and_writes_nothing():
    """FlashInfer's meaning: a row whose write slot alone is negative reads its slot, computes
    and outputs as any other, and stores no state: the pool is unchanged but for the other
    rows' write slots."""
    args = Problem(**SMALL, pool_size=8, separate_write_slots=True, seed=3).make("cpu")
    args["output_state_indices"][2] = -1
    pool = args["initial_state"].double()
    ref, naive = run_both(args, pool)
    compare(ref, naive, pool)
    assert naive["live"] == [0, 1, 2]
    assert ref.output[2].abs().sum() > 0
    # The row's output is the one it has when its state goes elsewhere.
    args["output_state_indices"][2] = 7
    assert torch.equal(run_both(args, pool)[0].output[2], ref.output[2])
    written = args["output_state_indices"][:2].long()
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(ref.pool[untouched], pool[untouched])


def test_state_is_rounded_only_when_stored():
    """bf16 pool: T=3 tokens run in float64 from the upcast slot; only the stored state is bf16."""
    args = Problem(**SMALL, pool_size=4, seed=5).make("cpu")
    pool = args["initial_state"]
    assert pool.dtype == torch.bfloat16
    ref, naive = run_both(args, pool)
    live = naive["live"]
    assert_close("output", ref.output, naive["output"])
    assert_close("intermediate states", ref.intermediates[live], naive["states"])
    written = args["initial_state_indices"].long()
    assert ref.pool.dtype == torch.bfloat16
    assert torch.equal(ref.pool[written], torch.from_numpy(naive["final"]).to(torch.bfloat16))


def test_default_scale_is_k_to_the_minus_half():
    args = Problem(**SMALL, seed=9).make("cpu")
    pool = args["state"].double()
    default, _ = run_both(args, pool)
    explicit, _ = run_both({**args, "scale": SMALL["K"] ** -0.5}, pool)
    assert torch.equal(default.output, explicit.output)
    other, _ = run_both({**args, "scale": 0.5}, pool)
    assert not torch.allclose(default.output, other.output)


# -- softplus ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x", [-1000.0, -50.0, -1.0, 0.0, 3.0, 19.5, 20.0, 20.0001, 25.0, 88.0, 1000.0, 1e30]
)
def test_softplus(x):
    got = float(softplus(torch.tensor([x], dtype=torch.float64)))
    assert math.isfinite(got)
    want = naive_softplus(x)
    assert got == pytest.approx(want, rel=1e-15, abs=1e-300)
    if x > 20:
        assert got == x, "linear branch above the threshold"


def test_large_gate_input_gives_finite_results():
    """x = a + dt_bias far above 20 (exp(x) overflows) and far below 0: no NaN, no inf."""
    args = Problem(**SMALL, gate_dtype="fp32", seed=13).make("cpu")
    args["a"][0, :, :2] = 1e4  # g = exp(-exp(A_log) * 1e4) = 0: the state is forgotten
    args["a"][1, :, :2] = -1e4  # softplus ~ 0: g = 1, no decay
    pool = args["state"].double()
    ref, naive = run_both(args, pool)
    compare(ref, naive, pool)
    assert torch.isfinite(ref.output).all() and torch.isfinite(ref.final_state).all()
