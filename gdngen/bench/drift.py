"""Long-horizon drift of the stored state (issue 51, item 2): plain decode (T = 1) for thousands
of steps, the state stored in each format of :mod:`gdngen.reference.state_formats` after every
step, against the float64 recurrence run over the same inputs with nothing rounded.

Every value head runs on its own (heads are independent in the recurrence). A format's run
computes in fp32 (the kernels' contract) from the state it loaded, and rounds the state through
the format after every step, as a decode call stores it once per token.

Inputs (no trained model's activations are at hand, so these are stand-ins, said as such):

- q, k, v: standard normal, rounded to bf16 (the activations' dtype); q and k L2-normalised,
  q scaled by K ** -0.5, as the kernel does.
- A_log, dt_bias: the initialisation of FLA's GatedDeltaNet and Qwen3-Next: A ~ U(1, 16),
  A_log = log A; dt log-uniform in [1e-3, 1e-1], dt_bias = softplus^-1(dt). dt is stratified
  over the heads (head i draws from the i-th of HEADS equal log-bins) so that every run spans
  long-memory heads (g near 1) and fast-forgetting ones.
- a, b (the per-token gate projections): standard normal, bf16-rounded. So
  softplus(a + dt_bias) ~ dt * exp(a), g = exp(-A * dt * exp(a)) and beta = sigmoid(b).
- ``--dt-range`` and ``--b-mean`` shift these towards long memory (smaller dt: g nearer 1) and
  weak writes (negative b: small beta), where a rounded state loses small updates first.

Run: ``python -m gdngen.bench.drift [--steps 4096] [--heads 8] [--seed 0] [--dt-range LOW HIGH]
[--b-mean B] [--out FOLDER]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gdngen.reference.decode import gates, l2_normalize
from gdngen.reference.state_formats import FORMATS, bytes_per_element, round_trip

HEAD_DIM = 128
CHECKPOINTS = (1, 64, 512, 4096)
TRACE_EVERY = 32  # the per-step traces written to --out keep every 32nd step


@dataclass
class Inputs:
    """One sequence of ``steps`` decode steps for ``heads`` value heads, in float64 (the
    reference's) with the gates also in fp32 (the formats' runs)."""

    q: torch.Tensor  # [steps, heads, K], normalised and scaled
    k: torch.Tensor  # [steps, heads, K], normalised
    v: torch.Tensor  # [steps, heads, V]
    g: torch.Tensor  # [steps, heads]
    beta: torch.Tensor  # [steps, heads]


def make_inputs(
    steps: int,
    heads: int,
    seed: int,
    dt_range: tuple[float, float] = (1e-3, 1e-1),
    b_mean: float = 0.0,
    K: int = HEAD_DIM,
    V: int = HEAD_DIM,
):
    """The inputs of the module docstring, drawn from ``seed``; ``dt_range`` and ``b_mean``
    (the mean of b) move the heads towards longer memory and weaker writes."""
    gen = torch.Generator().manual_seed(seed)

    def bf16_normal(*shape):
        return torch.randn(*shape, generator=gen).bfloat16().double()

    A_log = torch.log(1 + 15 * torch.rand(heads, generator=gen, dtype=torch.float64))
    bins = (torch.arange(heads) + torch.rand(heads, generator=gen, dtype=torch.float64)) / heads
    dt_low, dt_high = dt_range
    dt = torch.exp(math.log(dt_low) + bins * math.log(dt_high / dt_low))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # softplus^-1
    b = b_mean + bf16_normal(steps, heads)
    g, beta = gates(A_log, bf16_normal(steps, heads), dt_bias, b)
    q = l2_normalize(bf16_normal(steps, heads, K)) * K**-0.5
    k = l2_normalize(bf16_normal(steps, heads, K))
    return Inputs(q=q, k=k, v=bf16_normal(steps, heads, V), g=g, beta=beta)


def step(h, q, k, v, g, beta):
    """One token of docs/design.md ("The math") on ``h`` [heads, V, K], in ``h``'s dtype."""
    h = g[:, None, None] * h
    u = beta[:, None] * (v - torch.einsum("hvk,hk->hv", h, k))
    h = h + u[..., None] * k[:, None, :]
    return h, torch.einsum("hvk,hk->hv", h, q)


def relative(x: torch.Tensor, ref: torch.Tensor, dims) -> torch.Tensor:
    """||x - ref|| / ||ref|| over ``dims``."""
    return torch.linalg.vector_norm(x.double() - ref, dim=dims) / torch.linalg.vector_norm(
        ref, dim=dims
    )


def simulate(inputs: Inputs, formats=FORMATS, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """Per format, per step: the output's and the state's relative error over all heads
    (``output``, ``state``) and the largest per-head relative state error (``state_worst_head``)."""
    steps, heads, K = inputs.k.shape
    V = inputs.v.shape[-1]
    rounding = torch.Generator().manual_seed(seed + 1)  # stochastic rounding's draws
    reference = torch.zeros(heads, V, K, dtype=torch.float64)
    states = {fmt: torch.zeros(heads, V, K) for fmt in formats}
    residuals = {fmt: None for fmt in formats}
    errors = {
        fmt: {key: torch.empty(steps) for key in ("output", "state", "state_worst_head")}
        for fmt in formats
    }
    fp32 = [x.float() for x in (inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta)]
    for t in range(steps):
        reference, output = step(
            reference, inputs.q[t], inputs.k[t], inputs.v[t], inputs.g[t], inputs.beta[t]
        )
        for fmt in formats:
            h, o = step(states[fmt], *(x[t] for x in fp32))
            states[fmt], residuals[fmt] = round_trip(
                h, fmt, generator=rounding, residual=residuals[fmt]
            )
            errors[fmt]["output"][t] = relative(o, output, (0, 1))
            errors[fmt]["state"][t] = relative(states[fmt], reference, (0, 1, 2))
            errors[fmt]["state_worst_head"][t] = relative(states[fmt], reference, (1, 2)).max()
    return errors


def checkpoints(steps: int) -> list[int]:
    return sorted({c for c in CHECKPOINTS if c <= steps} | {steps})


def summary(errors, steps: int, K: int = HEAD_DIM) -> list[dict]:
    """One row per format: errors at the checkpoints (1-based steps), their maxima over all
    steps, the growth of the state error from step steps/8 to the last, bytes per element."""
    rows = []
    for fmt, err in errors.items():
        row = {"format": fmt, "bytes_per_element": bytes_per_element(fmt, K)}
        for key, trace in err.items():
            row[key] = {c: trace[c - 1].item() for c in checkpoints(steps)}
            row[key + "_max"] = trace.max().item()
        row["state_growth"] = err["state"][steps - 1].item() / err["state"][steps // 8 - 1].item()
        rows.append(row)
    return rows


def gate_statistics(inputs: Inputs) -> dict:
    """Quantiles of g and beta over all steps and heads, and each head's mean g with its
    memory length 1 / (1 - mean g) in steps."""
    levels = torch.tensor([0.0, 0.01, 0.5, 0.99, 1.0], dtype=torch.float64)
    mean_g = inputs.g.mean(0)
    return {
        "quantile_levels": levels.tolist(),
        "g": torch.quantile(inputs.g.flatten(), levels).tolist(),
        "beta": torch.quantile(inputs.beta.flatten(), levels).tolist(),
        "head_mean_g": mean_g.tolist(),
        "head_memory_steps": (1 / (1 - mean_g)).tolist(),
    }


def markdown(rows: list[dict], steps: int) -> str:
    marks = checkpoints(steps)
    head = (
        ["format", "bytes/elem"]
        + [f"o @{c}" for c in marks]
        + ["o max"]
        + [f"state @{c}" for c in marks]
        + ["state max", "worst head @last", f"growth @{steps}/@{steps // 8}"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = (
            [row["format"], f"{row['bytes_per_element']:.4g}"]
            + [f"{row['output'][c]:.2e}" for c in marks]
            + [f"{row['output_max']:.2e}"]
            + [f"{row['state'][c]:.2e}" for c in marks]
            + [
                f"{row['state_max']:.2e}",
                f"{row['state_worst_head'][steps]:.2e}",
                f"{row['state_growth']:.2f}",
            ]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gdngen.bench.drift", description=__doc__)
    parser.add_argument("--steps", type=int, default=4096, help="decode steps (default 4096)")
    parser.add_argument("--heads", type=int, default=8, help="value heads (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dt-range",
        type=float,
        nargs=2,
        default=(1e-3, 1e-1),
        help="dt's log-uniform range (default FLA's 1e-3 1e-1)",
    )
    parser.add_argument("--b-mean", type=float, default=0.0, help="mean of b (default 0)")
    parser.add_argument("--out", type=Path, help="folder for drift.json and drift.md")
    args = parser.parse_args(argv)
    if args.steps < 8:
        parser.error("--steps must be at least 8 (the growth compares step steps/8 with the last)")

    start = time.perf_counter()
    inputs = make_inputs(args.steps, args.heads, args.seed, tuple(args.dt_range), args.b_mean)
    errors = simulate(inputs, seed=args.seed)
    seconds = time.perf_counter() - start
    rows = summary(errors, args.steps)
    stats = gate_statistics(inputs)
    table = markdown(rows, args.steps)
    print(table)
    print(f"\ng quantiles {stats['quantile_levels']}: {[f'{x:.4g}' for x in stats['g']]}")
    print(f"beta quantiles: {[f'{x:.3g}' for x in stats['beta']]}")
    print(f"head mean g: {[f'{x:.4f}' for x in stats['head_mean_g']]}")
    print(f"{args.steps} steps x {args.heads} heads x {len(FORMATS)} formats: {seconds:.1f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        marks = sorted({0, *range(TRACE_EVERY - 1, args.steps, TRACE_EVERY), args.steps - 1})
        record = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "seconds": seconds,
            "gates": stats,
            "summary": rows,
            "trace_steps": [m + 1 for m in marks],
            "traces": {
                fmt: {key: [f"{trace[m].item():.4e}" for m in marks] for key, trace in err.items()}
                for fmt, err in errors.items()
            },
        }
        (args.out / "drift.json").write_text(json.dumps(record, indent=1) + "\n")
        (args.out / "drift.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
