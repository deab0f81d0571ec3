"""Checking one implementation's call against the float64 reference before it is timed."""

from __future__ import annotations

import torch

from gdngen.problem import PackedProblem, Problem, state_copy
from gdngen.reference import reference_decode
from gdngen.reference.decode import reference_call

#: rows of a cell the correctness check compares (the first few and the last)
CHECK_ROWS = 6
#: an int8 state's stored rows against the float64 state: each value within half its row's
#: step amax / 127 (round to nearest), a relative error of at most sqrt(K) / 254 over a row
#: (one value carrying the row), 6.3% at K = 256; a wrong kernel is off by its whole size
INT8_CHECK_TOL = 0.07
#: an fp8 e4m3 state's: 3 mantissa bits keep each value within 2^-4 of itself (6.25% of the
#: row at most), plus 2^-10 of its row's scale near zero (the subnormals)
FP8_CHECK_TOL = 0.08
SCALED_CHECK_TOL = {"int8": INT8_CHECK_TOL, "fp8_e4m3": FP8_CHECK_TOL}


def check_tolerance(state_dtype: str, tolerance: float) -> float:
    """A check's bound on relative error for a state dtype: ``tolerance``, the caller's for a
    state that rounds by less than it, or the quantized state's own."""
    return max(tolerance, SCALED_CHECK_TOL.get(state_dtype, 0.0))


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def check_against_reference(
    problem: Problem, args: dict, bound, pool_before: torch.Tensor
) -> float:
    """Largest relative error (output, written state) over a few batch rows, after one run."""
    bound.run()
    torch.cuda.synchronize()
    B = problem.batch
    rows = torch.tensor(sorted({*range(min(B, CHECK_ROWS - 1)), B - 1}), device="cuda")
    reads = args.get("initial_state_indices")
    writes = args.get("output_state_indices", reads)
    ref = reference_decode(
        args["q"][rows], args["k"][rows], args["v"][rows], pool_before, args["A_log"],
        args["a"][rows], args["dt_bias"], args["b"][rows], scale=problem.scale,
        use_qk_l2norm=problem.use_qk_l2norm,
        read_slots=None if reads is None else reads[rows],
        write_slots=None if writes is None else writes[rows],
        disable_state_update=problem.disable_state_update, state_layout=problem.layout,
    ) if reads is not None else reference_decode(
        args["q"][rows], args["k"][rows], args["v"][rows], pool_before[rows], args["A_log"],
        args["a"][rows], args["dt_bias"], args["b"][rows], scale=problem.scale,
        use_qk_l2norm=problem.use_qk_l2norm, disable_state_update=problem.disable_state_update,
        state_layout=problem.layout,
    )  # fmt: skip
    errors = [_rel(bound.read_output()[rows], ref.output)]
    if not problem.disable_state_update:
        state = bound.read_state()
        slots = rows if bound.slots is None else bound.slots.long()[rows]
        got = state[slots]
        if problem.layout == "v_last":
            got = got.transpose(-1, -2)
        errors.append(_rel(got, ref.final_state))
    return max(errors)


def check_packed_against_reference(problem: PackedProblem, args: dict, bound) -> float:
    """:func:`check_against_reference` for vLLM's per-token slot form (``problem.slots`` is
    "per_token"): the largest relative error of the output and of every state the call stored
    (in ``args``' pool, where the call writes), over a few of its sequences, after one run. The
    reference runs those sequences on a pool of only the slots their table names (dequantized
    where quantized), so that a cell of 4 G state values needs no copy of its whole pool."""
    if problem.slots != "per_token" or problem.flat or problem.mixed_qkv:
        raise ValueError(
            f"problem: expected the per-token slot form with [1, tokens, ...] inputs; got {problem}"
        )
    device = args["q"].device
    N, null = problem.sequences, args.get("null_slot", -1)
    rows = sorted({*range(min(N, CHECK_ROWS - 1)), N - 1})
    bounds = args["cu_seqlens"].long().cpu()
    tokens = torch.cat([torch.arange(int(bounds[r]), int(bounds[r + 1])) for r in rows])
    tokens = tokens.to(device)
    lengths = torch.tensor([int(bounds[r + 1] - bounds[r]) for r in rows])
    cu = torch.zeros(len(rows) + 1, dtype=torch.int64)
    cu[1:] = lengths.cumsum(0)
    picked = torch.tensor(rows, device=device)
    table = args["initial_state_indices"][picked].long()
    live = table > null
    slots = torch.unique(table[live])
    before = state_copy(args, slots)
    bound.run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    # slot 0 of the small pool stands for no slot (padding entries keep their values <= 0)
    small = torch.cat([torch.zeros_like(before[:1]), before])
    remapped = torch.where(live, torch.searchsorted(slots, table) + 1, table)
    ref = reference_call(
        args["q"][:, tokens], args["k"][:, tokens], args["v"][:, tokens], small, args["A_log"],
        args["a"][:, tokens], args["dt_bias"], args["b"][:, tokens], scale=args.get("scale"),
        use_qk_l2norm=args.get("use_qk_l2norm", True), read_slots=remapped, null_slot=null,
        cu_seqlens=cu.to(device), num_accepted=args["num_accepted_tokens"][picked],
        state_layout=problem.layout,
    )  # fmt: skip
    output = bound.read_output()[:, tokens]
    written = ~torch.isnan(ref.output)
    errors = [_rel(output[written], ref.output[written])]
    stored = state_copy(args, table[live])
    errors.append(_rel(stored, ref.pool[remapped[live]].to(stored.device).double()))
    return max(errors)
