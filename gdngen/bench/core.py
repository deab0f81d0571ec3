"""``python -m gdngen.bench.core``: the fused decode core against the chain an engine runs today
(docs/design.md, "The fused decode core" and "Measuring").

Per cell (state dtype, HV, T, B), side by side in one process (gdngen.measure.timing), in vLLM's
call forms on a K-last pool: T = 1 is decode (``[B]`` slots, one token a request, the rows
``[B, D]`` without ``cu_seqlens``: gdngen.measure.core_cell.call_form); T > 1 is
speculative verify (a ``[B, T]`` per-token slot table with ``num_accepted_tokens``, the tokens
packed with ``cu_seqlens``), whose every token's state is written to its slot.

- **fused core**: one ``gdn_decode`` call on the pre-conv rows, with the conv1d prologue (its
  state in vLLM's per-token form at T > 1) and the gated RMSNorm epilogue, as dispatched: the
  fused kernel, or the split plan where a rule says so (its variant column names the plan);
- **split plan**: gdngen's own conv step, then the decode kernel with the norm fused, in one
  ``gdn_decode`` call on the split plan (``split_conv_call``; docs/design.md, "The conv1d step
  apart"), whatever the dispatch picks;
- **steps plan**: every fused step a kernel of gdngen's own, in one ``gdn_decode`` call
  (``split_steps_call``: the conv step, the variant the dispatch gives the bare recurrence, the
  norm step; docs/design.md, "The norm step apart");
- **conv, fused rest**: the conv kernel, then one ``gdn_decode`` with the norm fused;
- **chain (gdngen)**: the conv kernel, the unfused ``gdn_decode``, the norm kernel;
- **chain (flashinfer)**: the conv kernel, FlashInfer's recurrence in its own form (T > 1: its
  verify with the positional state cache), the norm kernel, where FlashInfer serves the cell; it
  reads its own q/k/v of the same size, as it takes no ``mixed_qkv``;
- **chain (vllm, triton norm)**, **chain (vllm, inductor norm)**: vLLM's own chain in its call
  forms, on the same rows, pools and slots (gdngen.bench.vllm_chain): its Triton conv update,
  its packed-decode recurrence (T > 1: its speculative-decode recurrence), then its FLA-style
  Triton norm or its Inductor-compiled one; where a bundle of vLLM's source is given
  (``--vllm-src`` or ``$GDNGEN_VLLM_SRC``, made by ``tools/vllm_bundle.py``);
- **recurrence alone**: the unfused ``gdn_decode``, for what the fused steps add to it.

The conv and norm kernels are FLA's (gdngen.bench.chain_steps; the norm falls back to torch).
FLA's conv keeps a dense ``[B, D, W]`` cache; at T > 1 its sequence kernel reads the window and
returns the final one, which is less than a verify conv writes (every token's input, for the
roll-back). ``--no-conv`` drops the conv step from every entry. The conv state pool has vLLM's
default layout, a ``[slots, D, columns]`` view of a ``[slots, columns, D]`` buffer
(``--conv-layout channels_first``: a dense ``[slots, D, columns]`` pool). The geometry is
Qwen3-Next's (HV = 32) or Qwen3.5's (HV = 64): H = 16 key heads, K = V = 128. Each cell's fused
output is checked against the gdngen chain's before timing, and so is each vLLM chain's output
and recurrent pool (its conv pool against the fused call's). Writes ``core.json`` and
``core.md``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import torch

from gdngen.bench import vllm_chain
from gdngen.bench.chain_steps import EPS, fla_conv1d, fla_gated_rmsnorm, torch_gated_rmsnorm
from gdngen.measure.environment import environment
from gdngen.measure.impls import FlashInfer
from gdngen.measure.summary import geometric_mean, relative_error
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side
from gdngen.measure.vllm_kernels import SOURCE_ENV, VllmKernels, vllm_kernels
from gdngen.measure.core_cell import CONV_LAYOUTS, call_form, core_problem, steps_bytes
from gdngen.measure.core_cell import core_inputs as cell_inputs
from gdngen.problem import TORCH_DTYPES, PackedProblem, Problem

CONV_WIDTH = 4
#: a check's relative error must stay below bf16's resolution of a few roundings
CHECK_TOLERANCE = 2**-7
#: the bytes one FlashInfer input set moves past which the peer reuses a single set
PEER_SET_BYTES = 4 << 30


def core_inputs(problem: PackedProblem, seed: int, conv: bool,
                conv_layout: str = "channels_first", vllm: bool = False) -> dict:  # fmt: skip
    """One input set (gdngen.measure.core_cell.core_inputs; the default layout is the one the
    scripts of earlier records ran), with FLA's dense conv cache holding the same windows and,
    with ``vllm``, what vLLM's calls take beyond them. Without ``conv`` the conv tensors go."""
    s = cell_inputs(problem, seed, conv_width=CONV_WIDTH, conv_layout=conv_layout)
    if not conv:
        for name in ("conv_state", "conv_weight", "conv_bias"):
            del s[name]
    else:
        args, pool = s["args"], s["conv_state"]
        B, channels = problem.sequences, pool.shape[1]
        table = args["initial_state_indices"].long()
        fla_cache = torch.zeros(B, channels, CONV_WIDTH, dtype=torch.bfloat16, device="cuda")
        if table.dim() == 1:
            fla_cache[:, :, 1:] = pool[table]
        else:  # the window of each row starts at its num_accepted_tokens - 1
            for n, accepted in enumerate(args["num_accepted_tokens"].tolist()):
                fla_cache[n, :, 1:] = pool[table[n, 0], :, accepted - 1 : accepted + CONV_WIDTH - 2]
        s["fla_cache"] = fla_cache
    if vllm:
        vllm_chain.prepare_set(s, conv)
    return s


def peer_problem(problem: PackedProblem) -> Problem:
    """The cell in FlashInfer's form: dense rows, a pool, at T > 1 its verify with a cache."""
    verify = problem.tokens > 1
    return Problem(
        batch=problem.sequences, tokens=problem.tokens, HV=problem.HV,
        state_dtype=problem.state_dtype, pool_size=problem.sequences,
        cache_steps=problem.tokens if verify else None, disable_state_update=verify,
    )  # fmt: skip


def run_cell(target, steps, flashinfer, vllm: VllmKernels | str, *, batch, tokens, HV,
             state_dtype, conv, conv_layout="channels_last", replays=25) -> dict:  # fmt: skip
    conv_step, norm_step = steps
    problem = core_problem(batch, tokens, HV, state_dtype)
    pool_bytes = batch * tokens * HV * problem.K * problem.V * TORCH_DTYPES[state_dtype].itemsize
    with_vllm = not isinstance(vllm, str)
    sets = [
        core_inputs(problem, i, conv, conv_layout, vllm=with_vllm)
        for i in range(rotating_sets(2 * pool_bytes))
    ]
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

    def kwargs(s, rows, *, with_conv=False, norm=False):
        """gdn_decode's keywords on the rows, with the conv's and the norm's, in the cell's
        call form (gdngen.measure.core_cell.call_form)."""
        chosen = dict(s["args"], mixed_qkv=rows, output=s["output"])
        if with_conv:
            chosen.update(conv_kwargs(s))
        if norm:
            chosen.update(norm_kwargs(s))
        return call_form(chosen)

    def core(s):
        return kwargs(s, s["args"]["mixed_qkv"], with_conv=True, norm=True)

    def fused(s):
        call(**core(s))

    split_call = target.split_conv_call()

    def split(s):
        split_call(**core(s))

    steps_call = target.split_steps_call()

    def steps(s):
        steps_call(**core(s))

    def conv_fused_rest(s):
        call(**kwargs(s, convolved(s), norm=True))

    def chain(s):
        call(**kwargs(s, convolved(s)))
        return norm_step(s["output"], s["z"], s["norm_weight"])

    def recurrence(s):
        call(**kwargs(s, s["args"]["mixed_qkv"]))

    first = sets[0]
    variant = call.prepare(**core(first))
    plain_variant = call.prepare(**kwargs(first, first["args"]["mixed_qkv"]))
    error = check_fused(first, fused, chain, conv)
    vllm_runs = vllm_chains(vllm, problem, conv)
    vllm_errors = (
        {} if isinstance(vllm_runs, str) else check_vllm(first, vllm_runs, chain, fused, conv)
    )
    runs = {"fused core": [lambda s=s: fused(s) for s in sets]}
    split_variant = steps_variant = None
    if conv:
        split_variant = split_call.prepare(**core(first))
        error = max(error, check_fused(first, split, chain, conv))
        runs["split plan"] = [lambda s=s: split(s) for s in sets]
        steps_variant = steps_call.prepare(**core(first))
        error = max(error, check_fused(first, steps, chain, conv))
        runs["steps plan"] = [lambda s=s: steps(s) for s in sets]
        runs["conv, fused rest"] = [lambda s=s: conv_fused_rest(s) for s in sets]
    runs["chain (gdngen)"] = [lambda s=s: chain(s) for s in sets]
    peer = flashinfer_chain(flashinfer, peer_problem(problem), sets, convolved, norm_step)
    if isinstance(peer, str):
        skipped = {"chain (flashinfer)": peer}
    else:
        runs["chain (flashinfer)"], skipped = peer, {}
    if isinstance(vllm_runs, str):
        skipped.update({vllm_entry(norm): vllm_runs for norm in vllm_chain.NORMS})
    else:
        for name, run in vllm_runs.items():
            runs[name] = [lambda s=s, run=run: run(s) for s in sets]
    runs["recurrence alone"] = [lambda s=s: recurrence(s) for s in sets]
    return dict(
        batch=batch, tokens=tokens, H=problem.H, HV=HV, K=problem.K, V=problem.V,
        state_dtype=state_dtype, conv=conv, conv_layout=conv_layout, variant=variant,
        plain_variant=plain_variant, split_variant=split_variant, steps_variant=steps_variant,
        error=error,
        vllm_errors=vllm_errors, skipped=skipped,
        us=time_side_by_side(runs, replays=replays),
    )  # fmt: skip


def vllm_entry(norm: str) -> str:
    return f"chain (vllm, {norm})"


def vllm_chains(vllm: VllmKernels | str, problem: PackedProblem, conv: bool) -> dict | str:
    """vLLM's chain with each of its norms, ``{entry: run(s)}``, or why it is missing."""
    if isinstance(vllm, str):
        return vllm
    if vllm.null_block_id != problem.null_slot:
        return (
            f"vLLM {vllm.version} pads with slot {vllm.null_block_id}; the cells pad with "
            f"slot {problem.null_slot}"
        )
    return {
        vllm_entry(norm): vllm_chain.vllm_chain(
            vllm, vllm_chain.vllm_norm(vllm, norm), H=problem.H, K=problem.K, V=problem.V,
            tokens=problem.tokens, conv=conv,
        )  # fmt: skip
        for norm in vllm_chain.NORMS
    }


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


def state_digest(pool: torch.Tensor, slots: int = 16) -> torch.Tensor:
    """Each row of the pool's states projected on one fixed random vector, in float64 (``[slots,
    HV, V]``): what a wrong slot, head, row or column order changes, at a fraction of the pool's
    size (a copy of a large pool would not fit beside the sets and the check's own copy)."""
    gen = torch.Generator(device=pool.device).manual_seed(0)
    weights = torch.randn(pool.shape[-1], generator=gen, device=pool.device, dtype=torch.float64)
    return torch.cat([part.double() @ weights for part in pool.split(slots)])


def check_vllm(s: dict, vllm_runs: dict, chain, fused, conv: bool) -> dict:
    """Each vLLM chain on the set against the gdngen chain: its output and the recurrent pool it
    leaves (by state_digest), and the conv pool it leaves against the fused call's (the gdngen
    chain's conv keeps FLA's dense cache instead). Same inputs and states for all, restored after
    each. A relative error past CHECK_TOLERANCE fails the run: a wrong argument form shows here."""
    pool = s["args"]["initial_state"]
    states = [pool] + ([s["conv_state"], s["fla_cache"]] if conv else [])
    before = [t.clone() for t in states]

    def restore():
        for t, b in zip(states, before):
            t.copy_(b)

    expected_output = chain(s).clone()
    expected_pool = state_digest(pool)
    restore()
    if conv:
        fused(s)
        expected_conv = s["conv_state"].clone()
        restore()
    errors = {}
    for name, run in vllm_runs.items():
        output = run(s)
        errors[name] = dict(
            output=relative_error(output, expected_output),
            state=relative_error(state_digest(pool), expected_pool),
            conv_state=relative_error(s["conv_state"], expected_conv) if conv else None,
        )
        restore()
        for what, e in errors[name].items():
            assert e is None or e < CHECK_TOLERANCE, (
                f"{name}: its {what} differs from the gdngen chain's (conv state: the fused "
                f"call's): relative error {e:.3g}"
            )
    return errors


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


#: the entries that are one ``gdn_decode`` call of gdngen's, each a plan the dispatch may pick
GDNGEN_PLANS = ("fused core", "split plan", "steps plan")


def floor_us(record: dict, copy_GBps: float) -> float | None:
    """The cell's floor: the recurrence alone, plus the bytes the conv and the norm add at copy
    bandwidth (None for a cell without the conv, or a record without its geometry)."""
    if not record.get("conv", True) or not all(k in record for k in ("H", "K", "V")):
        return None
    problem = core_problem(record["batch"], record["tokens"], record["HV"],
                           record["state_dtype"], H=record["H"], K=record["K"],
                           V=record["V"])  # fmt: skip
    added = steps_bytes(problem, CONV_WIDTH) / (copy_GBps * 1e3)  # bytes / (GB/s) in µs
    return record["us"]["recurrence alone"] + added


def markdown(records: list[dict], env: dict) -> str:
    """The cells as one table: every entry's µs, then the fastest chain (the vLLM chains among
    them) over the fused call, the faster vLLM chain over it ("-" where vLLM is missing), and the
    fused call over the recurrence alone; then the best of gdngen's plans: vLLM's chain over it
    and it over the floor (:func:`floor_us`)."""
    names = list(dict.fromkeys(n for r in records for n in r["us"]))
    vllm_names = [vllm_entry(norm) for norm in vllm_chain.NORMS]
    lines = [
        f"GPU: {env.get('gpu')}; copy bandwidth {env.get('copy_GBps', 0):.0f} GB/s; "
        f"FLA steps: {env.get('fla_steps')}; vLLM chain: {env.get('vllm')}; "
        f"conv state: {env.get('conv_layout')}",
        "",
        "| state | HV | T | B | fused variant | "
        + " | ".join(f"{n} µs" for n in names)
        + " | fastest chain / fused | vllm chain / fused | fused / recurrence"
        + " | split / recurrence | vllm chain / best plan | best plan / floor |",
        "|" + "---|" * (11 + len(names)),
    ]
    ratios, vllm_ratios, best_ratios = [], [], []
    for r in records:
        us = r["us"]
        fused = us["fused core"]
        best = min(us[n] for n in GDNGEN_PLANS if n in us)
        ratios.append(min(v for n, v in us.items() if n.startswith("chain")) / fused)
        vllm_us = [us[n] for n in vllm_names if n in us]
        vllm_cell = best_cell = "-"
        if vllm_us:
            vllm_ratios.append(min(vllm_us) / fused)
            best_ratios.append(min(vllm_us) / best)
            vllm_cell, best_cell = f"{vllm_ratios[-1]:.2f}", f"{best_ratios[-1]:.2f}"
        floor = floor_us(r, env.get("copy_GBps", 0))
        floor_cell = "-" if floor is None else f"{best / floor:.3f}"
        cells = " | ".join(f"{us[n]:.2f}" if n in us else "-" for n in names)
        lines.append(
            f"| {r['state_dtype']} | {r['HV']} | {r['tokens']} | {r['batch']} | `{r['variant']}` "
            f"| {cells} | {ratios[-1]:.2f} | {vllm_cell} | "
            f"{fused / us['recurrence alone']:.3f} | {split_ratio(us)} | {best_cell} | "
            f"{floor_cell} |"
        )
    lines.append(
        f"\nfastest chain / fused: geometric mean {geometric_mean(ratios):.2f}x over "
        f"{len(records)} cells"
    )
    if vllm_ratios:
        lines.append(
            f"vllm chain / fused: geometric mean {geometric_mean(vllm_ratios):.2f}x over "
            f"{len(vllm_ratios)} cells"
        )
        lines.append(
            f"vllm chain / best plan: geometric mean {geometric_mean(best_ratios):.2f}x, "
            f"min {min(best_ratios):.2f}x over {len(best_ratios)} cells"
        )
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
    parser.add_argument(
        "--conv-layout", choices=CONV_LAYOUTS, default="channels_last",
        help="the conv state pool: vLLM's default view of [slots, columns, D] (channels_last) or "
        "a dense [slots, D, columns] (channels_first)",
    )  # fmt: skip
    parser.add_argument(
        "--vllm-src", default=None,
        help=f"vLLM's source for its chain: a folder or .tar.xz that tools/vllm_bundle.py made "
        f"(default ${SOURCE_ENV}); without it the vLLM chains are reported missing",
    )  # fmt: skip
    parser.add_argument("--replays", type=int, default=25, help="timed replays of each entry")
    parser.add_argument(
        "--no-flashinfer", action="store_true", help="leave out the chain with FlashInfer's "
        "recurrence (reported missing)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    target = importlib.import_module(f"generated.{args.target}")
    conv = not args.no_conv
    fla_conv, fla_norm = fla_conv1d(), fla_gated_rmsnorm()
    if conv and fla_conv is None:
        parser.error("the conv step needs FLA (fla.modules.causal_conv1d); or pass --no-conv")
    steps = (fla_conv, fla_norm or torch_gated_rmsnorm)
    vllm = vllm_kernels(args.vllm_src)
    env = dict(environment(), copy_GBps=copy_bandwidth() / 1e9,
               fla_steps=("conv, " if conv else "") + ("norm" if fla_norm else "(torch norm)"),
               vllm=f"missing ({vllm})" if isinstance(vllm, str) else vllm.version,
               conv_layout=args.conv_layout)  # fmt: skip
    print(f"vLLM chain: {env['vllm']}", flush=True)
    flashinfer = FlashInfer()
    if args.no_flashinfer:
        flashinfer.missing = "left out (--no-flashinfer)"
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for dtype in args.dtypes.split(","):
        for HV in map(int, args.heads.split(",")):
            for tokens in map(int, args.tokens.split(",")):
                for batch in map(int, args.batches.split(",")):
                    record = run_cell(target, steps, flashinfer, vllm, batch=batch,
                                      tokens=tokens, HV=HV, state_dtype=dtype, conv=conv,
                                      conv_layout=args.conv_layout,
                                      replays=args.replays)  # fmt: skip
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
