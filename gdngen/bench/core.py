"""``python -m gdngen.bench.core``: the fused decode core against the chain an engine runs today
(docs/design.md, "The fused decode core" and "Measuring").

Per cell (state dtype, HV, T, B), side by side in one process (gdngen.measure.timing):

- **fused**: one ``gdn_decode`` call with the gated RMSNorm epilogue (``z=``, ``norm_weight=``);
- **chain (torch norm)**: the same dispatch without the epilogue, then the gated RMSNorm in torch
  (fp32 math, the engines' fallback);
- **chain (FLA norm)**: the same recurrence, then FLA's fused gated-RMSNorm kernel (when FLA
  imports);
- **recurrence alone**: the unfused call, for the cost of the epilogue itself.

T = 1 is decode (the final state written); T > 1 is verify (every token's state cached, no final
write). Each fused output is compared with the chain's before timing. Writes ``core.json`` and
``core.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
from pathlib import Path

import torch

from gdngen.measure.environment import environment
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side
from gdngen.problem import TORCH_DTYPES, Problem

EPS = 1e-6


def torch_gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, out: torch.Tensor):
    x = o.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    out.copy_(x * weight.float() * torch.nn.functional.silu(z.float()))


def fla_gated_rmsnorm():
    """FLA's fused gated RMSNorm as ``norm(o, z, weight, out)`` (returning its own output), or
    None without FLA."""
    try:
        from fla.modules.fused_norm_gate import rms_norm_gated
    except ImportError:
        return None

    def norm(o, z, weight, out):
        # FLA returns a new tensor: an engine takes it as it is, so ``out`` stays unwritten
        # (a copy into it would charge the chain a kernel the engine does not run).
        return rms_norm_gated(
            o.reshape(-1, o.shape[-1]), z.reshape(-1, z.shape[-1]), weight, None,
            activation="swish", eps=EPS,
        )  # fmt: skip

    return norm


def run_cell(target, fla_norm, *, batch: int, tokens: int, HV: int, state_dtype: str) -> dict:
    verify = tokens > 1
    problem = Problem(
        batch=batch, tokens=tokens, HV=HV, state_dtype=state_dtype, pool_size=batch,
        cache_steps=tokens if verify else None, disable_state_update=verify,
    )  # fmt: skip
    B, T, V = batch, tokens, problem.V
    pool_bytes = B * HV * problem.K * V * problem.state_bytes()
    count = rotating_sets(pool_bytes * (T + 1))
    sets = []
    for index in range(count):
        args = problem.with_(seed=index).make("cuda")
        gen = torch.Generator(device="cuda").manual_seed(index)
        z = torch.randn(B, T, HV, V, generator=gen, device="cuda").to(torch.bfloat16)
        weight = (1 + 0.1 * torch.randn(V, generator=gen, device="cuda")).to(torch.bfloat16)
        o = torch.empty(B, T, HV, V, dtype=torch.bfloat16, device="cuda")
        normed = torch.empty_like(o)
        sets.append((args, z, weight, o, normed))
    call = target.gdn_decode

    def fused(s):
        args, z, weight, _, normed = s
        call(**args, output=normed, z=z, norm_weight=weight, norm_eps=EPS)

    def recurrence(s):
        args, _, _, o, _ = s
        call(**args, output=o)

    def chain(norm):
        def run(s):
            recurrence(s)
            norm(s[3], s[1], s[2], s[4])

        return run

    args, z, weight, o, normed = sets[0]
    variant = call.prepare(**args, output=normed, z=z, norm_weight=weight, norm_eps=EPS)
    plain_variant = call.prepare(**args, output=o)
    pool = args["initial_state"]
    before = pool.clone()
    fused(sets[0])
    fused_out = normed.clone()
    pool.copy_(before)
    chain(torch_gated_rmsnorm)(sets[0])
    pool.copy_(before)
    error = float((fused_out.double() - normed.double()).norm() / normed.double().norm())
    assert error < 2**-7, f"fused and chained outputs differ: relative error {error:.3g}"
    if fla_norm is not None:
        fla_out = fla_norm(o, z, weight, None).view(normed.shape).double()
        fla_error = float((fla_out - normed.double()).norm() / normed.double().norm())
        assert fla_error < 2**-7, f"FLA's norm differs from torch's: relative error {fla_error:.3g}"
    torch_chain = chain(torch_gated_rmsnorm)
    runs = {
        "fused": [lambda s=s: fused(s) for s in sets],
        "chain (torch norm)": [lambda s=s: torch_chain(s) for s in sets],
        "recurrence alone": [lambda s=s: recurrence(s) for s in sets],
    }
    if fla_norm is not None:
        fla_chain = chain(fla_norm)
        runs["chain (FLA norm)"] = [lambda s=s: fla_chain(s) for s in sets]
    times = time_side_by_side(runs)
    return dict(
        batch=batch, tokens=tokens, HV=HV, state_dtype=state_dtype, variant=variant,
        plain_variant=plain_variant, error=error, us=times,
    )  # fmt: skip


def markdown(records: list[dict], env: dict) -> str:
    names = list(records[0]["us"])
    lines = [
        f"GPU: {env.get('gpu')}; copy bandwidth {env.get('copy_GBps', 0):.0f} GB/s",
        "",
        "| state | HV | T | B | fused variant | "
        + " | ".join(f"{n} µs" for n in names)
        + " | chain / fused | fused / recurrence |",
        "|" + "---|" * (7 + len(names)),
    ]
    for r in records:
        us = r["us"]
        best_chain = min(v for n, v in us.items() if n.startswith("chain"))
        lines.append(
            f"| {r['state_dtype']} | {r['HV']} | {r['tokens']} | {r['batch']} | `{r['variant']}` | "
            + " | ".join(f"{us[n]:.2f}" for n in names)
            + f" | {best_chain / us['fused']:.2f} | {us['fused'] / us['recurrence alone']:.3f} |"
        )
    ratios = [
        min(v for n, v in r["us"].items() if n.startswith("chain")) / r["us"]["fused"]
        for r in records
    ]
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
    args = parser.parse_args(argv)
    target = importlib.import_module(f"generated.{args.target}")
    fla_norm = fla_gated_rmsnorm()
    env = dict(environment(), copy_GBps=copy_bandwidth() / 1e9, fla_norm=fla_norm is not None)
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for dtype in args.dtypes.split(","):
        for HV in map(int, args.heads.split(",")):
            for tokens in map(int, args.tokens.split(",")):
                for batch in map(int, args.batches.split(",")):
                    record = run_cell(
                        target, fla_norm, batch=batch, tokens=tokens, HV=HV, state_dtype=dtype
                    )
                    records.append(record)
                    print(json.dumps(record), flush=True)
                    (args.out / "core.json").write_text(
                        json.dumps(dict(environment=env, records=records), indent=1)
                    )
    (args.out / "core.md").write_text(markdown(records, env))
    print(markdown(records, env))


if __name__ == "__main__":
    main()
