"""``python -m gdngen.bench.core``: the fused decode core against the chain an engine runs today
(docs/design.md, "The fused decode core" and "Measuring").

Per cell (state dtype, HV, T, B), side by side in one process (gdngen.measure.timing), in vLLM's
call forms on a K-last pool: T = 1 is decode (``[B]`` slots, one token a request); T > 1 is
speculative verify (a ``[B, T]`` per-token slot table with ``num_accepted_tokens``, the tokens
packed with ``cu_seqlens``), whose every token's state is written to its slot.

- **fused core**: one ``gdn_decode`` call on the pre-conv rows, with the conv1d prologue (its
  state in vLLM's per-token form at T > 1) and the gated RMSNorm epilogue;
- **split plan**: gdngen's own conv step, then the decode kernel with the norm fused, in one
  ``gdn_decode`` call on the split plan (``split_conv_call``; docs/design.md, "The conv1d step
  apart"), whatever the dispatch picks;
- **conv, fused rest**: the conv kernel, then one ``gdn_decode`` with the norm fused;
- **chain (gdngen)**: the conv kernel, the unfused ``gdn_decode``, the norm kernel;
- **chain (flashinfer)**: the conv kernel, FlashInfer's recurrence in its own form (T > 1: its
  verify with the positional state cache), the norm kernel, where FlashInfer serves the cell; it
  reads its own q/k/v of the same size, as it takes no ``mixed_qkv``;
- **recurrence alone**: the unfused ``gdn_decode``, for what the fused steps add to it.

The conv and norm kernels are FLA's (gdngen.bench.chain_steps; the norm falls back to torch).
FLA's conv keeps a dense ``[B, D, W]`` cache; at T > 1 its sequence kernel reads the window and
returns the final one, which is less than a verify conv writes (every token's input, for the
roll-back). ``--no-conv`` drops the conv step from every entry. Each cell's fused output is
checked against the gdngen chain's before timing. Writes ``core.json`` and ``core.md``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
from pathlib import Path

import torch

from gdngen.bench.chain_steps import EPS, fla_conv1d, fla_gated_rmsnorm, torch_gated_rmsnorm
from gdngen.measure.environment import environment
from gdngen.measure.impls import FlashInfer
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side
from gdngen.problem import TORCH_DTYPES, PackedProblem, Problem

CONV_WIDTH = 4
#: the bytes one FlashInfer input set moves past which the peer reuses a single set
PEER_SET_BYTES = 4 << 30


def core_problem(batch: int, tokens: int, HV: int, state_dtype: str) -> PackedProblem:
    """vLLM's form of the cell: [B] slots at T = 1, a per-token table at T > 1, slot 0 null."""
    return PackedProblem(
        sequences=batch, tokens=tokens, HV=HV, state_dtype=state_dtype, mixed_qkv=True,
        slots="per_token" if tokens > 1 else "row",
    )  # fmt: skip


def core_inputs(problem: PackedProblem, seed: int, conv: bool) -> dict:
    """One input set: gdn_decode's arguments (on contiguous pre-conv rows), the norm's, and the
    conv's: the fused call's state pool and FLA's dense cache holding the same windows."""
    args = problem.with_(seed=seed).make("cuda")
    gen = torch.Generator(device="cuda").manual_seed(10_000 + seed)
    B, T, H, HV, K, V = (problem.sequences, problem.tokens, problem.H, problem.HV, problem.K,
                         problem.V)  # fmt: skip
    channels = 2 * H * K + HV * V

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * std).to(torch.bfloat16)

    args["mixed_qkv"] = randn(1, B * T, channels)
    s = dict(
        args=args,
        z=randn(1, B * T, HV, V),
        norm_weight=(1 + 0.1 * torch.randn(V, generator=gen, device="cuda")).to(torch.bfloat16),
        output=torch.empty(1, B * T, HV, V, dtype=torch.bfloat16, device="cuda"),
    )
    if conv:
        slots = args["initial_state"].shape[0]
        pool = randn(slots, channels, CONV_WIDTH - 2 + T)
        table = args["initial_state_indices"].long()
        fla_cache = torch.zeros(B, channels, CONV_WIDTH, dtype=torch.bfloat16, device="cuda")
        if table.dim() == 1:
            fla_cache[:, :, 1:] = pool[table]
        else:  # the window of each row starts at its num_accepted_tokens - 1
            for n, accepted in enumerate(args["num_accepted_tokens"].tolist()):
                fla_cache[n, :, 1:] = pool[table[n, 0], :, accepted - 1 : accepted + CONV_WIDTH - 2]
        s.update(
            conv_state=pool,
            conv_weight=randn(channels, CONV_WIDTH, std=0.5),
            conv_bias=randn(channels, std=0.2),
            fla_cache=fla_cache,
        )
    return s


def peer_problem(problem: PackedProblem) -> Problem:
    """The cell in FlashInfer's form: dense rows, a pool, at T > 1 its verify with a cache."""
    verify = problem.tokens > 1
    return Problem(
        batch=problem.sequences, tokens=problem.tokens, HV=problem.HV,
        state_dtype=problem.state_dtype, pool_size=problem.sequences,
        cache_steps=problem.tokens if verify else None, disable_state_update=verify,
    )  # fmt: skip


def run_cell(target, steps, flashinfer, *, batch, tokens, HV, state_dtype, conv) -> dict:
    conv_step, norm_step = steps
    problem = core_problem(batch, tokens, HV, state_dtype)
    pool_bytes = batch * tokens * HV * problem.K * problem.V * TORCH_DTYPES[state_dtype].itemsize
    sets = [core_inputs(problem, i, conv) for i in range(rotating_sets(2 * pool_bytes))]
    call = target.gdn_decode
    norm_kwargs = lambda s: dict(z=s["z"], norm_weight=s["norm_weight"], norm_eps=EPS)  # noqa: E731

    def conv_kwargs(s):
        if not conv:
            return {}
        return dict(conv_state=s["conv_state"], conv_weight=s["conv_weight"],
                    conv_bias=s["conv_bias"])  # fmt: skip

    def convolved(s):
        """FLA's conv of the set's rows, as gdn_decode's packed mixed_qkv (or the rows as they
        are without the conv)."""
        x = s["args"]["mixed_qkv"]
        if not conv:
            return x
        y = conv_step(x.view(batch, tokens, -1), s["fla_cache"], s["conv_weight"], s["conv_bias"])
        return y.view(x.shape)

    def with_rows(s, rows):
        return dict(s["args"], mixed_qkv=rows)

    def fused(s):
        call(**with_rows(s, s["args"]["mixed_qkv"]), **conv_kwargs(s), **norm_kwargs(s),
             output=s["output"])  # fmt: skip

    split_call = target.split_conv_call()

    def split(s):
        split_call(**with_rows(s, s["args"]["mixed_qkv"]), **conv_kwargs(s), **norm_kwargs(s),
                   output=s["output"])  # fmt: skip

    def conv_fused_rest(s):
        call(**with_rows(s, convolved(s)), **norm_kwargs(s), output=s["output"])

    def chain(s):
        call(**with_rows(s, convolved(s)), output=s["output"])
        return norm_step(s["output"], s["z"], s["norm_weight"])

    def recurrence(s):
        call(**with_rows(s, s["args"]["mixed_qkv"]), output=s["output"])

    first = sets[0]
    variant = call.prepare(**with_rows(first, first["args"]["mixed_qkv"]), **conv_kwargs(first),
                           **norm_kwargs(first), output=first["output"])  # fmt: skip
    plain_variant = call.prepare(**with_rows(first, first["args"]["mixed_qkv"]),
                                 output=first["output"])  # fmt: skip
    error = check_fused(first, fused, chain, conv)
    runs = {"fused core": [lambda s=s: fused(s) for s in sets]}
    split_variant = None
    if conv:
        split_variant = split_call.prepare(
            **with_rows(first, first["args"]["mixed_qkv"]), **conv_kwargs(first),
            **norm_kwargs(first), output=first["output"],
        )  # fmt: skip
        error = max(error, check_fused(first, split, chain, conv))
        runs["split plan"] = [lambda s=s: split(s) for s in sets]
        runs["conv, fused rest"] = [lambda s=s: conv_fused_rest(s) for s in sets]
    runs["chain (gdngen)"] = [lambda s=s: chain(s) for s in sets]
    peer = flashinfer_chain(flashinfer, peer_problem(problem), sets, convolved, norm_step)
    if isinstance(peer, str):
        skipped = {"chain (flashinfer)": peer}
    else:
        runs["chain (flashinfer)"], skipped = peer, {}
    runs["recurrence alone"] = [lambda s=s: recurrence(s) for s in sets]
    return dict(
        batch=batch, tokens=tokens, HV=HV, state_dtype=state_dtype, conv=conv, variant=variant,
        plain_variant=plain_variant, split_variant=split_variant, error=error, skipped=skipped,
        us=time_side_by_side(runs),
    )  # fmt: skip


def check_fused(s: dict, fused, chain, conv: bool) -> float:
    """The fused output against the gdngen chain's on the same inputs and states (restored after),
    as a relative error below bf16's resolution of a few roundings."""
    states = [s["args"]["initial_state"]] + ([s["conv_state"], s["fla_cache"]] if conv else [])
    before = [t.clone() for t in states]
    fused(s)
    fused_out = s["output"].double()
    for t, b in zip(states, before):
        t.copy_(b)
    chained = chain(s).double().view(fused_out.shape)
    for t, b in zip(states, before):
        t.copy_(b)
    error = float((fused_out - chained).norm() / chained.norm())
    assert error < 2**-7, f"fused and chained outputs differ: relative error {error:.3g}"
    return error


def flashinfer_chain(flashinfer, problem: Problem, sets, convolved, norm_step):
    """The chain with FlashInfer's recurrence on each set (on its own inputs of the cell's
    shapes), or why FlashInfer does not serve the cell."""
    reason = flashinfer.supports(problem)
    if reason is not None:
        return reason
    runs = []
    # Its own inputs, as many sets as the others rotate through; past PEER_SET_BYTES one set
    # serves every call (far beyond L2 either way), so that a large cell fits beside the others.
    peer_sets = 1 if problem.moved_bytes() > PEER_SET_BYTES else len(sets)
    bounds = [
        flashinfer.bind(problem, problem.with_(seed=i).make("cuda")) for i in range(peer_sets)
    ]
    for index, s in enumerate(sets):
        bound = bounds[index % peer_sets]
        output = bound.read_output()

        def run(s=s, bound=bound, output=output):
            convolved(s)
            bound.run()
            norm_step(output, s["z"].view(output.shape), s["norm_weight"])

        runs.append(run)
    return runs


def split_ratio(us: dict) -> str:
    if "split plan" not in us:
        return "-"
    return f"{us['split plan'] / us['recurrence alone']:.3f}"


def markdown(records: list[dict], env: dict) -> str:
    names = list(dict.fromkeys(n for r in records for n in r["us"]))
    lines = [
        f"GPU: {env.get('gpu')}; copy bandwidth {env.get('copy_GBps', 0):.0f} GB/s; "
        f"FLA steps: {env.get('fla_steps')}",
        "",
        "| state | HV | T | B | fused variant | "
        + " | ".join(f"{n} µs" for n in names)
        + " | fastest chain / fused | fused / recurrence | split / recurrence |",
        "|" + "---|" * (8 + len(names)),
    ]
    ratios = []
    for r in records:
        us = r["us"]
        best_chain = min(v for n, v in us.items() if n.startswith("chain"))
        ratios.append(best_chain / us["fused core"])
        cells = " | ".join(f"{us[n]:.2f}" if n in us else "-" for n in names)
        lines.append(
            f"| {r['state_dtype']} | {r['HV']} | {r['tokens']} | {r['batch']} | `{r['variant']}` "
            f"| {cells} | {ratios[-1]:.2f} | {us['fused core'] / us['recurrence alone']:.3f} "
            f"| {split_ratio(us)} |"
        )
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    lines.append(f"\nfastest chain / fused: geometric mean {geo:.2f}x over {len(records)} cells")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gdngen.bench.core")
    parser.add_argument("--target", default="h200")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,4,16,64,256,512")
    parser.add_argument("--tokens", default="1,2,4,8")
    parser.add_argument("--heads", default="32,64")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--no-conv", action="store_true", help="no conv1d step in any entry")
    args = parser.parse_args(argv)
    target = importlib.import_module(f"generated.{args.target}")
    conv = not args.no_conv
    fla_conv, fla_norm = fla_conv1d(), fla_gated_rmsnorm()
    if conv and fla_conv is None:
        parser.error("the conv step needs FLA (fla.modules.causal_conv1d); or pass --no-conv")
    steps = (fla_conv, fla_norm or torch_gated_rmsnorm)
    env = dict(environment(), copy_GBps=copy_bandwidth() / 1e9,
               fla_steps=("conv, " if conv else "") + ("norm" if fla_norm else "(torch norm)"))  # fmt: skip
    flashinfer = FlashInfer()
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for dtype in args.dtypes.split(","):
        for HV in map(int, args.heads.split(",")):
            for tokens in map(int, args.tokens.split(",")):
                for batch in map(int, args.batches.split(",")):
                    record = run_cell(target, steps, flashinfer, batch=batch, tokens=tokens,
                                      HV=HV, state_dtype=dtype, conv=conv)  # fmt: skip
                    records.append(record)
                    torch.cuda.empty_cache()  # the next cell's pools differ in size
                    print(json.dumps(record), flush=True)
                    (args.out / "core.json").write_text(
                        json.dumps(dict(environment=env, records=records), indent=1)
                    )
    (args.out / "core.md").write_text(markdown(records, env))
    print(markdown(records, env))


if __name__ == "__main__":
    main()
