"""Benchmark results as a readable markdown table (and the metadata that makes it reproducible)."""

from __future__ import annotations

import json
import math
from collections import defaultdict

from .run import Result

PEER_TITLES = {"flashinfer": "FlashInfer", "fla": "FLA"}
LAYOUT_TITLES = {"k_last": "K-last [B,HV,V,K]", "v_last": "V-last [B,HV,K,V]"}


def dump_record(record: dict) -> str:
    """A bench record (``meta``, ``results`` and any notes) as JSON with one result per line:
    smaller than an indented dump, and a re-run's diff names the cells that moved."""
    head = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in record.items() if k != "results"]
    rows = ",\n".join(f"  {json.dumps(result)}" for result in record["results"])
    return "{\n" + ",\n".join(head + [f' "results": [\n{rows}\n ]']) + "\n}\n"


def _head_dims(K: int, V: int) -> str:
    """The head dims as a table title names them; empty for the default K = V = 128."""
    if (K, V) == (128, 128):
        return ""
    return f"K=V={K}" if K == V else f"K={K} V={V}"


def _cell(result: Result | None) -> str:
    if result is None:
        return "-"
    if result.us is None:
        return "n/a" if result.status.startswith("n/a") else "failed"
    text = f"{result.us:.2f} ({100 * result.sol:.0f}%)"
    if result.status != "ok":
        text += " !"
    return text


def speedup(ours: Result | None, peer: Result | None) -> float | None:
    if ours is None or peer is None or ours.us is None or peer.us is None:
        return None
    return peer.us / ours.us


#: the dispatched call should be within this fraction of the fastest single variant of a cell
DISPATCH_TOLERANCE = 0.03


def fastest_variant(by_impl: dict[str, Result], ours: str = "gdngen") -> Result | None:
    """The fastest single variant timed in a cell (beside the dispatched call), if any."""
    timed = [r for name, r in by_impl.items() if name != ours and name not in PEER_TITLES and r.us]
    return min(timed, key=lambda r: r.us) if timed else None


def dispatch_excess(by_impl: dict[str, Result], ours: str = "gdngen") -> float | None:
    """How much slower the dispatched call was than the fastest single variant (0.01 = 1%)."""
    mine, best = by_impl.get(ours), fastest_variant(by_impl, ours)
    if mine is None or mine.us is None or best is None:
        return None
    return mine.us / best.us - 1


def _dispatch_summary(cells: dict[str, dict[str, Result]], where: str) -> str | None:
    """One line: in how many of ``cells`` (by label) the dispatched call met DISPATCH_TOLERANCE."""
    excess = {
        key: e for key, by_impl in cells.items() if (e := dispatch_excess(by_impl)) is not None
    }
    if not excess:
        return None
    within = sum(e <= DISPATCH_TOLERANCE for e in excess.values())
    label, worst = max(excess.items(), key=lambda item: item[1])
    return (
        f"Dispatched call within {100 * DISPATCH_TOLERANCE:g}% of the fastest single variant "
        f"timed beside it{where}: {within} of {len(excess)} cells (largest gap {100 * worst:+.1f}% "
        f"at {label})."
    )


def markdown(results: list[Result], meta: dict, ours: str = "gdngen") -> str:
    peers = [name for name in PEER_TITLES if any(r.impl == name for r in results)]
    with_variants = any(r.impl != ours and r.impl not in PEER_TITLES for r in results)
    groups: dict[tuple, dict[tuple, dict[str, Result]]] = defaultdict(lambda: defaultdict(dict))
    for r in results:
        groups[(r.K, r.V, r.layout, r.state_dtype, r.mode, r.tokens)][(r.HV, r.batch)][r.impl] = r
    lines = [
        f"GPU: {meta['gpu']} ({meta['sm']}"
        + (f", {meta['gpu_uuid']}" if meta.get("gpu_uuid") else "")
        + f"), copy bandwidth {meta['copy_bw'] / 1e12:.2f} TB/s "
        f"(1 GiB device-to-device copy, read + write).",
        f"Date: {meta['date']}. Command: `{meta['command']}`."
        + (f" **Incomplete:** the run was {meta['stopped']}." if meta.get("stopped") else ""),
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v) + ".",
        "",
        "Each cell: microseconds per call (percent of copy bandwidth for the bytes the call must "
        "move: state read, state written unless verify, intermediate states if cached, plus q/k/v/"
        "gates/output). CUDA graph of back-to-back calls over rotating input sets >= 4x L2, median "
        "of the replays (25 by default, in 5 rounds interleaved with the gdngen entries of the "
        "cell); every implementation checked against the float64 reference first, all in one "
        "process. Speedup = peer time / gdngen time. `n/a`: the peer has no such path; `!`: "
        "its check against the reference failed.",
        "",
    ]
    if with_variants:
        lines += [
            "`fastest variant`: the fastest of the single variants timed side by side with the "
            "dispatched call in the cell (same inputs, replays interleaved); `vs fastest`: how much "
            "slower the dispatched call was than it (negative: faster).",
            "",
        ]
    all_cells: dict[tuple, dict[str, Result]] = {}
    for (K, V, layout, state_dtype, mode, tokens), cells in sorted(groups.items()):
        dims = _head_dims(K, V)
        lines.append(
            f"### {LAYOUT_TITLES[layout]}, {state_dtype} state, T={tokens}, {mode}"
            + (f", {dims}" if dims else "")
        )
        lines.append("")
        header = ["HV", "B", "gdngen us (%SOL)", "variant"]
        header += [f"{PEER_TITLES[p]} us (%SOL)" for p in peers]
        header += [f"vs {PEER_TITLES[p]}" for p in peers]
        if with_variants:
            header += ["fastest variant us", "vs fastest"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for (HV, batch), by_impl in sorted(cells.items()):
            mine = by_impl.get(ours)
            row = [
                str(HV),
                str(batch),
                _cell(mine),
                f"`{mine.variant}`" if mine and mine.variant else "-",
            ]
            row += [_cell(by_impl.get(p)) for p in peers]
            for p in peers:
                s = speedup(mine, by_impl.get(p))
                row.append("-" if s is None else f"{s:.2f}x")
            if with_variants:
                best, excess = fastest_variant(by_impl, ours), dispatch_excess(by_impl, ours)
                same = best is not None and mine is not None and best.impl == mine.variant
                row.append(
                    "-"
                    if best is None
                    else f"{best.us:.2f}" + (" (same)" if same else f" `{best.impl}`")
                )
                row.append("-" if excess is None else f"{100 * excess:+.1f}%")
            lines.append("| " + " | ".join(row) + " |")
            all_cells[(dims, layout, state_dtype, mode, tokens, HV, batch)] = by_impl
        for p in peers:
            ratios = [
                s
                for cell in cells.values()
                if (s := speedup(cell.get(ours), cell.get(p))) is not None
            ]
            if ratios:
                geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                lines.append("")
                lines.append(
                    f"vs {PEER_TITLES[p]}: geometric mean {geo:.2f}x, min {min(ratios):.2f}x, "
                    f"max {max(ratios):.2f}x over {len(ratios)} cells."
                )
        summary = _dispatch_summary(
            {f"HV={HV} B={batch}": by_impl for (HV, batch), by_impl in cells.items()}, ""
        )
        if summary:
            lines += ["", summary]
        lines.append("")
    overall = _dispatch_summary(
        {
            f"{layout} {dtype} T={T} {mode}{' ' + dims if dims else ''} HV={HV} B={B}": by_impl
            for (dims, layout, dtype, mode, T, HV, B), by_impl in all_cells.items()
        },
        ", all tables",
    )
    if overall:
        lines += ["### Dispatch", "", overall, ""]
    problems = [r for r in results if r.status not in ("ok",) and not r.status.startswith("n/a")]
    if problems:
        lines.append("### Problems")
        lines.append("")
        for r in problems:
            dims = _head_dims(r.K, r.V)
            lines.append(
                f"- {r.impl} {r.layout} {r.state_dtype} {r.mode} T={r.tokens}"
                f"{' ' + dims if dims else ''} HV={r.HV} B={r.batch}: {r.status}"
            )
        lines.append("")
    return "\n".join(lines)
