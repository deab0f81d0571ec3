"""``python -m gdngen.bench.forms``: the engine call forms timed beside the positional form and
the peers (docs/design.md, "Call forms" and "Measuring").

Two tables, each cell timed side by side in one process (gdngen.measure.timing):

- **spec decode**: vLLM's form (tokens packed with ``cu_seqlens``, a [N, 1 + S] per-token slot
  table with ``num_accepted_tokens``, slot 0 as padding; placed from ``cu_seqlens``, and again
  with the caller's ``uniform_seqlen`` promise) against the positional form of the same
  dispatch (q as [B, T], [B] slots, a [B, T, ...] intermediate buffer, no final write), FlashInfer's
  multi-token path on the positional form, and FLA's varlen ``fused_recurrent_gated_delta_rule``
  (dense per-sequence state, final state returned). All four process the same tokens.
- **mixed_qkv decode**: one token per row from a [B, 2*H*K + HV*V] projection buffer (a, b as
  row-strided views) against the same call on separate contiguous q, k, v.

Each gdngen form is run once and compared with the others on the same inputs before timing (the
spec and positional forms of one kernel must agree exactly). Writes ``forms.json`` and
``forms.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
from pathlib import Path

import torch

from gdngen.measure.environment import environment
from gdngen.measure.impls import FLA, FlashInfer
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side
from gdngen.problem import TORCH_DTYPES, PackedProblem, Problem

#: the spec form with the caller's promise that every sequence has max_seqlen tokens
UNIFORM = "gdngen spec form, uniform_seqlen"


def spec_sets(target, problem: PackedProblem, count: int):
    """Per input set: the vLLM-form kwargs and the positional-form kwargs over the same data."""
    sets = []
    for index in range(count):
        spec = problem.with_(seed=index).make("cuda")
        N, T = problem.sequences, problem.tokens
        table = spec["initial_state_indices"]
        read = table.gather(1, (spec["num_accepted_tokens"].long() - 1)[:, None])[:, 0]
        positional = dict(
            q=spec["q"].view(N, T, problem.H, problem.K),
            k=spec["k"].view(N, T, problem.H, problem.K),
            v=spec["v"].view(N, T, problem.HV, problem.V),
            a=spec["a"].view(N, T, problem.HV),
            b=spec["b"].view(N, T, problem.HV),
            A_log=spec["A_log"],
            dt_bias=spec["dt_bias"],
            state=None,
            initial_state=spec["initial_state"],
            initial_state_indices=read.contiguous(),
            intermediate_states_buffer=torch.empty(
                (N, T, problem.HV, problem.V, problem.K),
                dtype=spec["initial_state"].dtype,
                device="cuda",
            ),
            disable_state_update=True,
        )
        sets.append((spec, positional))
    return sets


def run_spec_cell(target, flashinfer, fla, batch: int, tokens: int, state_dtype: str) -> dict:
    problem = PackedProblem(
        sequences=batch, tokens=tokens, state_dtype=state_dtype, H=16, HV=64, null_slot=0
    )
    set_bytes = batch * problem.HV * problem.V * problem.K * TORCH_DTYPES[state_dtype].itemsize
    # One set of at least 4x L2 defeats the L2 on its own: the largest fp32 cells (10 GiB of pool
    # a set at B = 512, T = 4) do not fit two sets beside the peers' own on an 80 GB card.
    count = rotating_sets(set_bytes * (tokens + 1), minimum=1)
    sets = spec_sets(target, problem, count)
    call = target.gdn_decode
    variant = call.prepare(**sets[0][0])
    positional_variant = call.prepare(**sets[0][1])

    # The two forms of one kernel agree exactly on the same inputs. Where a form rule serves the
    # spec form with another kernel than the positional form's, that kernel is pinned for the
    # check; the timing compares the two dispatched calls.
    check = call if positional_variant == variant else target.variant(variant)
    # The positional form goes first: it reads the initial slots and writes only its own buffer,
    # so the pool needs no copy (at fp32, B = 512, T = 8 it is 18 GiB); the spec form then writes
    # the state after each token into the table's slots, compared in slices of rows.
    spec, positional = sets[0]
    out_pos, _ = check(**positional)
    table = spec["initial_state_indices"].long()
    buffer = positional["intermediate_states_buffer"]  # [N, T, HV, V, K]
    # Both placements of the spec form: from cu_seqlens (the default), and at n * T where the
    # caller promises uniform_seqlen (every sequence here has T tokens). A spec call may write
    # a token's state over its row's initial slot, so the initial states are put back between.
    read = positional["initial_state_indices"].long()
    initial = spec["initial_state"][read].clone()
    for promise in (False, True):
        spec["initial_state"][read] = initial
        out_spec, _ = call(**spec, uniform_seqlen=promise)
        got = out_spec[0].view(batch, tokens, problem.HV, problem.V)
        assert torch.equal(got, out_pos), f"outputs (uniform_seqlen={promise})"
        for rows in torch.arange(batch, device=table.device).split(64):
            states = spec["initial_state"][table[rows]]
            assert torch.equal(states, buffer[rows]), f"per-token states ({promise})"

    outputs = [torch.empty_like(out_pos) for _ in sets]
    runs = {
        "gdngen spec form": [lambda s=s: call(**s) for s, _ in sets],
        UNIFORM: [lambda s=s: call(**s, uniform_seqlen=True) for s, _ in sets],
        "gdngen positional": [
            lambda p=p, o=o: call(**p, output=o) for (_, p), o in zip(sets, outputs)
        ],
    }
    peers = {}
    fi_problem = Problem(
        batch=batch, tokens=tokens, H=16, HV=64, state_dtype=state_dtype, pool_size=batch,
        cache_steps=tokens, disable_state_update=True,
    )  # fmt: skip
    reason = flashinfer.supports(fi_problem)
    if reason is None:
        binds = []
        for index in range(count):
            args = fi_problem.with_(seed=index).make("cuda")
            binds.append(flashinfer.bind(fi_problem, args).run)
        runs["flashinfer mtp (positional)"] = binds
    else:
        peers["flashinfer mtp (positional)"] = reason
    if fla.missing is None:
        fla_runs = []
        for spec, _ in sets:
            state = torch.randn(batch, problem.HV, problem.V, problem.K, device="cuda").to(
                spec["initial_state"].dtype
            )
            kwargs = dict(
                q=spec["q"], k=spec["k"], v=spec["v"], g=spec["a"], beta=spec["b"],
                A_log=spec["A_log"], dt_bias=spec["dt_bias"], scale=problem.K**-0.5,
                initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
                cu_seqlens=spec["cu_seqlens"].long(),
            )  # fmt: skip
            fla_runs.append(lambda kw=kwargs: fla.fn(**kw))
        runs["fla varlen"] = fla_runs
    else:
        peers["fla varlen"] = fla.missing
    times = time_side_by_side(runs)
    return dict(
        table="spec", batch=batch, tokens=tokens, state_dtype=state_dtype, variant=variant,
        positional_variant=positional_variant, us=times, not_run=peers,
    )  # fmt: skip


def run_mixed_cell(target, batch: int, state_dtype: str) -> dict:
    problem = PackedProblem(
        sequences=batch, tokens=1, slots="row", mixed_qkv=True, flat=True, null_slot=0,
        state_dtype=state_dtype, H=16, HV=64,
    )  # fmt: skip
    set_bytes = batch * problem.HV * problem.V * problem.K * TORCH_DTYPES[state_dtype].itemsize
    count = rotating_sets(set_bytes)
    call = target.gdn_decode
    mixed_sets, separate_sets = [], []
    H, K, HV, V = problem.H, problem.K, problem.HV, problem.V
    for index in range(count):
        args = problem.with_(seed=index).make("cuda")
        del args["cu_seqlens"], args["max_seqlen"]
        args["output"] = torch.empty(batch, 1, HV, V, dtype=torch.bfloat16, device="cuda")
        mixed = args["mixed_qkv"]
        separate = {n: v for n, v in args.items() if n != "mixed_qkv"}
        separate.update(
            q=mixed[:, : H * K].reshape(batch, 1, H, K).contiguous(),
            k=mixed[:, H * K : 2 * H * K].reshape(batch, 1, H, K).contiguous(),
            v=mixed[:, 2 * H * K :].reshape(batch, 1, HV, V).contiguous(),
            a=args["a"].contiguous()[:, None],
            b=args["b"].contiguous()[:, None],
            output=torch.empty_like(args["output"]),
        )
        mixed_sets.append(args)
        separate_sets.append(separate)
    variant = call.prepare(**mixed_sets[0])
    pool = mixed_sets[0]["initial_state"]
    before = pool.clone()
    call(**mixed_sets[0])
    after = pool.clone()
    pool.copy_(before)
    call(**separate_sets[0])
    assert torch.equal(mixed_sets[0]["output"], separate_sets[0]["output"]), "outputs"
    assert torch.equal(after, pool), "states"
    times = time_side_by_side(
        {
            "gdngen mixed_qkv": [lambda s=s: call(**s) for s in mixed_sets],
            "gdngen separate q/k/v": [lambda s=s: call(**s) for s in separate_sets],
        }
    )
    return dict(table="mixed", batch=batch, state_dtype=state_dtype, variant=variant, us=times)


def variants(record: dict) -> str:
    """The spec form's variant, and the positional form's where a form rule made them differ."""
    spec, positional = record["variant"], record.get("positional_variant", record["variant"])
    return f"`{spec}`" if spec == positional else f"`{spec}` (positional: `{positional}`)"


def markdown(records: list[dict], env: dict) -> str:
    lines = [f"GPU: {env.get('gpu')}; copy bandwidth {env.get('copy_GBps', 0):.0f} GB/s", ""]
    spec = [r for r in records if r["table"] == "spec"]
    if spec:
        names = list(spec[0]["us"])
        lines += [
            "| T | B | state | variant | "
            + " | ".join(f"{n} µs" for n in names)
            + " | spec / positional | uniform / positional | flashinfer / spec | fla / spec |",
            "|" + "---|" * (8 + len(names)),
        ]
        for r in spec:
            us = r["us"]
            s, p = us["gdngen spec form"], us["gdngen positional"]
            u = us.get(UNIFORM)
            fi = us.get("flashinfer mtp (positional)")
            fl = us.get("fla varlen")
            lines.append(
                f"| {r['tokens']} | {r['batch']} | {r['state_dtype']} | {variants(r)} | "
                + " | ".join(f"{us[n]:.2f}" if n in us else "-" for n in names)
                + f" | {s / p:.3f} | {u / p if u else float('nan'):.3f} | "
                f"{fi / s if fi else float('nan'):.2f} | {fl / s if fl else float('nan'):.2f} |"
            )
        for peer in ("flashinfer mtp (positional)", "fla varlen"):
            ratios = [r["us"][peer] / r["us"]["gdngen spec form"] for r in spec if peer in r["us"]]
            if ratios:
                geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
                lines.append(
                    f"\n{peer} / spec form: geometric mean {geo:.2f}x over {len(ratios)} cells"
                )
        for name in ("gdngen spec form", UNIFORM):
            ratios = [r["us"][name] / r["us"]["gdngen positional"] for r in spec if name in r["us"]]
            if ratios:
                lines.append(f"\nworst {name} / positional: {max(ratios):.3f}")
    mixed = [r for r in records if r["table"] == "mixed"]
    if mixed:
        lines += [
            "",
            "| B | state | variant | mixed_qkv µs | separate µs | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for r in mixed:
            m, s = r["us"]["gdngen mixed_qkv"], r["us"]["gdngen separate q/k/v"]
            lines.append(
                f"| {r['batch']} | {r['state_dtype']} | `{r['variant']}` | {m:.2f} | {s:.2f} | {m / s:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gdngen.bench.forms")
    parser.add_argument("--target", default="h200")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,8,32,128,512")
    parser.add_argument("--tokens", default="2,4,8")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--tables", default="spec,mixed")
    args = parser.parse_args(argv)
    target = importlib.import_module(f"generated.{args.target}")
    batches = [int(b) for b in args.batches.split(",")]
    dtypes = args.dtypes.split(",")
    flashinfer, fla = FlashInfer(), FLA()
    env = dict(environment(), copy_GBps=copy_bandwidth() / 1e9)
    records = []
    args.out.mkdir(parents=True, exist_ok=True)
    for table in args.tables.split(","):
        for dtype in dtypes:
            for batch in batches:
                if table == "spec":
                    for tokens in (int(t) for t in args.tokens.split(",")):
                        records.append(run_spec_cell(target, flashinfer, fla, batch, tokens, dtype))
                        print(json.dumps(records[-1]), flush=True)
                else:
                    records.append(run_mixed_cell(target, batch, dtype))
                    print(json.dumps(records[-1]), flush=True)
                (args.out / "forms.json").write_text(
                    json.dumps(dict(env=env, records=records), indent=1)
                )
    (args.out / "forms.md").write_text(markdown(records, env))
    print(markdown(records, env))


if __name__ == "__main__":
    main()
