"""``python -m gdngen.bench.pdl_layer``: a decode layer's chain, producer -> gdn_decode ->
consumer, with programmatic dependent launch on all three against none (docs/design.md,
"Programmatic dependent launch"), and gdn_decode alone both ways.

The producer writes the call's inputs (q, k, v, a, b; with ``--core`` the conv's input, z, a, b)
into one flat buffer and the consumer copies the output away (gdngen.bench.pdl_kernels): the
shortest kernels an engine's projection and output GEMM could be, so what the chain costs over
gdn_decode is launch and dependency latency. Each entry is a CUDA graph of back-to-back layers over
rotating input sets (gdngen.measure.timing), the entries interleaved; every set has its own pools,
so that each call may overlap the kernel before it. Before timing, the PDL chain's output and
pool are checked against the chain's without PDL (bit for bit: the kernels only move loads).

    python -m gdngen.bench.pdl_layer --out DIR [--batches 1,4,16] [--dtypes bf16,fp32] [--heads 64]

``--variants A,B`` times each named variant of the target (its ``variant(name)``, no dispatch)
in every cell instead of the dispatch's pick: how a dispatch rule for PDL calls is chosen.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gdngen.measure.environment import environment
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.runtime.pdl import STREAM_WRITES

from .pdl_kernels import consume, pattern, produce

H, K, V = 16, 128, 128
CONV_WIDTH = 4
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Layer:
    """One decode layer's buffers: the producer's flat buffer and the call's views of it, the
    pools and weights, the output, the consumer's history (a row per step) and the step."""

    buffer: torch.Tensor
    call_args: dict
    pool: torch.Tensor
    conv_pool: torch.Tensor | None
    output: torch.Tensor
    history: torch.Tensor
    step: torch.Tensor
    #: the call: a target's gdn_decode, or its split_conv_call()
    call: object = field(default=None)


def make_layer(
    call, batch: int, state_dtype: str, core: bool, *, HV: int = 64, seed: int = 0,
    history_rows: int = 2,
) -> Layer:  # fmt: skip
    """Rows of one token; a pool of 2 * batch + 1 slots with the rows' slots spread over it and,
    from two rows, the last row padding. The plain form takes q, k, v, a, b from the buffer; the
    core form (``core``) takes mixed_qkv before the conv, z, a, b, with a conv pool in vLLM's
    layout."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    slots = 2 * batch + 1
    HK, D = H * K, 2 * H * K + HV * V
    width = (D + HV * V if core else D) + 2 * HV
    buffer = torch.zeros(batch * width, dtype=torch.bfloat16, device="cuda")
    rows = buffer.view(batch, width)
    gates = rows[:, width - 2 * HV :]

    def bf16(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)

    args = dict(
        A_log=torch.rand(HV, generator=gen, device="cuda") * 2 - 1,
        dt_bias=torch.rand(HV, generator=gen, device="cuda") - 0.5,
        a=gates[:, :HV],
        b=gates[:, HV:],
    )
    conv_pool = None
    if core:
        conv_pool = bf16(torch.randn(slots, CONV_WIDTH - 1, D, generator=gen, device="cuda"))
        args.update(
            mixed_qkv=rows[:, :D],
            z=rows[:, D : D + HV * V].unflatten(-1, (HV, V)),
            norm_weight=bf16(1 + 0.1 * torch.randn(V, generator=gen, device="cuda")),
            conv_state=conv_pool.transpose(1, 2),
            conv_weight=bf16(0.5 * torch.randn(D, CONV_WIDTH, generator=gen, device="cuda")),
            conv_bias=bf16(0.2 * torch.randn(D, generator=gen, device="cuda")),
        )
    else:  # [B, T = 1, heads, dim] views, a and b [B, 1, HV]
        tokens = rows.unsqueeze(1)
        args.update(
            q=tokens[..., :HK].unflatten(-1, (H, K)),
            k=tokens[..., HK : 2 * HK].unflatten(-1, (H, K)),
            v=tokens[..., 2 * HK : D].unflatten(-1, (HV, V)),
            a=args["a"].unsqueeze(1),
            b=args["b"].unsqueeze(1),
        )
    pool = (0.1 * torch.randn(slots, HV, V, K, generator=gen, device="cuda")).to(
        DTYPES[state_dtype]
    )
    indices = torch.randperm(slots, generator=gen, device="cuda")[:batch].to(torch.int32)
    if batch > 1:
        indices[-1] = -1  # a padded row
    output_shape = (batch, HV, V) if core else (batch, 1, HV, V)
    output = torch.empty(output_shape, dtype=torch.bfloat16, device="cuda")
    history = torch.zeros(history_rows, output.numel(), dtype=torch.bfloat16, device="cuda")
    args.update(initial_state=pool, initial_state_indices=indices, output=output)
    step = torch.tensor([1, 0], dtype=torch.int32, device="cuda")  # the step, and 0
    return Layer(buffer, args, pool, conv_pool, output, history, step, call)


def decode(layer: Layer, *, pdl: bool, **over) -> None:
    """The layer's gdn_decode call (``over`` replaces arguments)."""
    args = dict(layer.call_args, **over)
    q, k, v = args.pop("q", None), args.pop("k", None), args.pop("v", None)
    layer.call(q, k, v, None, enable_pdl=pdl, **args)


def run_layer(layer: Layer, *, pdl: bool, calls: int = 1, spin: int = 0) -> None:
    """Producer, ``calls`` decode calls, consumer; all with the PDL attribute or none."""
    produce(layer.buffer, layer.step, spin=spin, pdl=pdl)
    for _ in range(calls):
        decode(layer, pdl=pdl)
    consume(layer.output.view(-1), layer.history, layer.step, pdl=pdl)


def held_off(layer: Layer) -> None:
    STREAM_WRITES.hold_off(layer.pool.device.index)
    decode(layer, pdl=True)


def check_chain(layer: Layer) -> None:
    """The PDL chain's output and pools against the chain's without PDL, bit for bit."""
    pool0 = layer.pool.clone()
    conv0 = None if layer.conv_pool is None else layer.conv_pool.clone()
    results = []
    for pdl in (False, True):
        layer.pool.copy_(pool0)
        if conv0 is not None:
            layer.conv_pool.copy_(conv0)
        run_layer(layer, pdl=pdl, spin=1000)
        torch.cuda.synchronize()
        results.append((layer.history[1].clone(), layer.pool.clone()))
        expected = pattern(layer.buffer.numel(), 1, layer.buffer.dtype, "cuda")
        if not torch.equal(layer.buffer, expected):
            raise AssertionError("the producer's pattern differs from its host-side twin")
    (out0, pool_0), (out1, pool_1) = results
    if not (torch.equal(out0, out1) and torch.equal(pool_0, pool_1)):
        raise AssertionError("the PDL chain's output or pool differs from the chain without PDL")
    layer.pool.copy_(pool0)
    if conv0 is not None:
        layer.conv_pool.copy_(conv0)


def run_cell(call, *, batch: int, state_dtype: str, HV: int, core: bool) -> dict:
    state_bytes = (2 * batch + 1) * HV * V * K * DTYPES[state_dtype].itemsize
    layers = [
        make_layer(call, batch, state_dtype, core, HV=HV, seed=i)
        for i in range(rotating_sets(state_bytes))
    ]
    check_chain(layers[0])
    options = dict(layers[0].call_args, enable_pdl=True)
    q, k, v = (options.pop(name, None) for name in ("q", "k", "v"))
    variant = call.prepare(q, k, v, None, **options)
    runs = {
        "layer, PDL": [lambda s=s: run_layer(s, pdl=True) for s in layers],
        "layer, no PDL": [lambda s=s: run_layer(s, pdl=False) for s in layers],
        "gdn_decode alone, PDL": [lambda s=s: decode(s, pdl=True) for s in layers],
        "gdn_decode alone, no PDL": [lambda s=s: decode(s, pdl=False) for s in layers],
        # the PDL kernel launched without the attribute: what its load order costs alone
        "gdn_decode alone, PDL kernel held off": [lambda s=s: held_off(s) for s in layers],
    }
    return dict(
        batch=batch, HV=HV, state_dtype=state_dtype, core=core, variant=variant,
        sets=len(layers), us=time_side_by_side(runs),
    )  # fmt: skip


def markdown(records: list[dict], env: dict) -> str:
    lines = [
        f"GPU: {env['gpu']} ({env['sm']}); gdngen {env.get('gdngen_commit')}",
        "",
        "| form | state | HV | B | variant | layer, PDL µs | layer, no PDL µs | saved µs "
        "| gdn_decode, PDL µs | gdn_decode, no PDL µs | PDL kernel held off µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        us = r["us"]
        lines.append(
            f"| {'core' if r['core'] else 'plain'} | {r['state_dtype']} | {r['HV']} | {r['batch']} "
            f"| `{r['variant']}` | {us['layer, PDL']:.2f} | {us['layer, no PDL']:.2f} "
            f"| {us['layer, no PDL'] - us['layer, PDL']:.2f} | {us['gdn_decode alone, PDL']:.2f} "
            f"| {us['gdn_decode alone, no PDL']:.2f} "
            f"| {us['gdn_decode alone, PDL kernel held off']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gdngen.bench.pdl_layer", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--heads", default="64")
    parser.add_argument("--forms", default="plain,core", help="plain, core (conv and norm fused)")
    parser.add_argument(
        "--variants", default="", help="comma-separated variants to time instead of the dispatch"
    )
    args = parser.parse_args(argv)
    import importlib

    target = importlib.import_module(f"generated.{args.target}")
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    records = []
    names = [name for name in args.variants.split(",") if name]
    calls = [target.variant(name) for name in names] or [target.gdn_decode]
    for form in args.forms.split(","):
        for state_dtype in args.dtypes.split(","):
            for HV in (int(h) for h in args.heads.split(",")):
                for batch in (int(b) for b in args.batches.split(",")):
                    for call in calls:
                        record = run_cell(
                            call, batch=batch, state_dtype=state_dtype, HV=HV,
                            core=form == "core",
                        )  # fmt: skip
                        records.append(record)
                        print(json.dumps(record), flush=True)
    (args.out / "pdl_layer.json").write_text(json.dumps(dict(env=env, records=records), indent=1))
    (args.out / "pdl_layer.md").write_text(markdown(records, env))
    print(markdown(records, env))


if __name__ == "__main__":
    main()
