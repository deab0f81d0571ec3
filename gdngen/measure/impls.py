"""The implementations a benchmark runs side by side: gdngen's calls and the peers.

Each adapter says whether it serves a problem (and why not), and turns one input set made by
:meth:`gdngen.problem.Problem.make` into a zero-argument call. Peers that are not installed are
reported as missing, not as errors.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from gdngen.problem import Problem, state_copy, state_of
from gdngen.terms import kernel_serves_head_dims

INT32_LIMIT = 2**31


@dataclass
class Bound:
    """A ready call, plus what to read back to check it."""

    run: Callable[[], None]
    #: the output of the last run
    read_output: Callable[[], torch.Tensor]
    #: the state tensor the last run updated (or returned), in the problem's layout; an int8
    #: pool's dequantized (gdngen.problem.state_copy)
    read_state: Callable[[], torch.Tensor]
    #: the batch rows' slots in read_state(), or None when it is per batch row
    slots: torch.Tensor | None


class Impl:
    name: str = ""
    #: why it cannot run at all (a peer not installed), else None
    missing: str | None = None

    def supports(self, problem: Problem) -> str | None:
        """None if this implementation serves ``problem``, else the reason it does not."""
        raise NotImplementedError

    def adapt(self, problem: Problem) -> Problem:
        """The form of ``problem`` this implementation runs (e.g. a dense state for FLA)."""
        return problem

    def compile(self, problem: Problem, args: dict) -> None:
        """What binding ``problem`` needs that runs on the host only (a JIT compile): done before
        the GPU turn in which the input sets are bound, so that processes sharing a GPU compile
        side by side while one of them times."""

    def bind(self, problem: Problem, args: dict) -> Bound:
        """One input set as a ready call. May launch work on the GPU (allocations, index
        conversions), so callers that share a GPU bind inside their GPU turn."""
        raise NotImplementedError


def _output(problem: Problem, args: dict) -> torch.Tensor:
    """The call's output buffer: v's shape ([B, T, HV, V], or [1, tokens, HV, V] packed)."""
    return torch.empty(args["v"].shape, dtype=args["v"].dtype, device="cuda")


class Gdngen(Impl):
    """gdngen's dispatching call of a target, or one pinned variant."""

    def __init__(self, target: str, variant: str | None = None) -> None:
        self.module = importlib.import_module(f"generated.{target}")
        self.call = self.module.gdn_decode if variant is None else self.module.variant(variant)
        self.variant = variant
        self.name = "gdngen" if variant is None else variant

    def supports(self, problem: Problem) -> str | None:
        info = self.module.INFO
        if (problem.layout, problem.state_dtype) not in info.served:
            return f"{problem.layout}/{problem.state_dtype} not served by target {info.name}"
        if self.variant is not None:
            module = self.call.module(self.variant)
            if (module.LAYOUT, module.STATE_DTYPE) != (problem.layout, problem.state_dtype):
                return "variant is for another layout/dtype"
            if not kernel_serves_head_dims(module, problem.K, problem.V):
                return f"variant is for K={module.HEAD_K_DIM} and V divisible by {module.TILE_V}"
        return None

    def chosen_variant(self, problem: Problem) -> str:
        if self.variant is not None:
            return self.variant
        return self.module.select(
            layout=problem.layout,
            state_dtype=problem.state_dtype,
            tokens=problem.tokens,
            batch_heads=problem.batch * problem.HV,
            intermediate=problem.cache_steps is not None,
            head_dims=(problem.K, problem.V),
            heads=problem.HV,  # a per-HV rule may serve this cell
        ).use

    def compile(self, problem: Problem, args: dict) -> None:
        self.call.prepare(**args)  # the checks and the kernel for this call's signature

    def bind(self, problem: Problem, args: dict) -> Bound:
        output = _output(problem, args)
        call = self.call
        self.call.prepare(**args)  # compiled by compile(): the signature's plan, cached
        pool, scales = state_of(args), args.get("state_scales")
        return Bound(
            run=lambda: call(**args, output=output),
            read_output=lambda: output,
            read_state=(lambda: pool) if scales is None else (lambda: state_copy(args)),
            slots=args.get("output_state_indices", args.get("initial_state_indices")),
        )


class FlashInfer(Impl):
    """FlashInfer 0.7.2: pretranspose (K-last, bf16/fp32), mtp (fp32 T>1), decode (V-last fp32)."""

    name = "flashinfer"

    def __init__(self) -> None:
        try:
            self.api = importlib.import_module("flashinfer.gdn_decode")
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            self.missing = f"flashinfer not importable ({type(exc).__name__}: {exc})"

    def supports(self, problem: Problem) -> str | None:
        if self.missing:
            return self.missing
        if problem.K != 128 or problem.V != 128:
            return "FlashInfer's GDN decode paths serve K=V=128"
        if problem.state_dtype == "fp16":
            return "FlashInfer's GDN decode paths take a bf16 or fp32 state"
        if problem.layout == "v_last":
            if problem.state_dtype != "fp32" or problem.tokens != 1:
                return "FlashInfer's V-last path is fp32 with T=1 only"
            if problem.cache_steps is not None or problem.disable_state_update:
                return "FlashInfer's V-last path has no cache or verify mode"
            return None
        if problem.tokens == 1 and (
            problem.cache_steps is not None or problem.disable_state_update
        ):
            return "FlashInfer rejects intermediate states or disable_state_update at T=1"
        if problem.cache_steps is not None:
            elements = problem.batch * problem.tokens * problem.HV * problem.V * problem.K
            if elements > INT32_LIMIT:
                return "skipped: its intermediate-state offsets overflow int32 at this size"
        return None

    def adapt(self, problem: Problem) -> Problem:
        if problem.layout == "v_last":  # its V-last path takes a dense per-batch state
            return problem.with_(pool_size=None, padded_rows=(), separate_write_slots=False)
        return problem

    def bind(self, problem: Problem, args: dict) -> Bound:
        api = self.api
        output = _output(problem, args)
        q, k, v, a, b = args["q"], args["k"], args["v"], args["a"], args["b"]
        A_log, dt_bias = args["A_log"], args["dt_bias"]
        if problem.layout == "v_last":
            state = args["state"]
            return Bound(
                run=lambda: api.gated_delta_rule_decode(
                    q, k, v, state, A_log, a, dt_bias, b, output=output, backend="flashinfer"
                ),
                read_output=lambda: output,
                read_state=lambda: state,
                slots=None,
            )
        pool = state_of(args)
        if args["state"] is not None:
            slots = torch.arange(problem.batch, dtype=torch.int32, device="cuda")
        else:
            slots = args["initial_state_indices"].to(torch.int32)
        cache = args.get("intermediate_states_buffer")
        disable = problem.disable_state_update
        if problem.state_dtype == "fp32" and problem.tokens > 1:
            run = lambda: api.gated_delta_rule_mtp(  # noqa: E731
                q, k, v, pool, slots, A_log, a, dt_bias, b, output=output,
                intermediate_states_buffer=cache, disable_state_update=disable, use_qk_l2norm=True,
            )  # fmt: skip
        else:
            run = lambda: api.gated_delta_rule_decode_pretranspose(  # noqa: E731
                q, k, v, None, A_log, a, dt_bias, b, output=output, use_qk_l2norm=True,
                initial_state=pool, initial_state_indices=slots, intermediate_states_buffer=cache,
                disable_state_update=disable, backend="flashinfer",
            )  # fmt: skip
        return Bound(run=run, read_output=lambda: output, read_state=lambda: pool, slots=slots)


class FLA(Impl):
    """flash-linear-attention 0.6.0 fused_recurrent_gated_delta_rule (gates in kernel).

    It has no pool, no in-place update and no intermediate states: it reads a dense per-batch
    state and returns a new fp32 final state, which is what is timed.
    """

    name = "fla"

    def __init__(self) -> None:
        try:
            module = importlib.import_module("fla.ops.gated_delta_rule")
            self.fn = module.fused_recurrent_gated_delta_rule
        except Exception as exc:  # noqa: BLE001
            self.missing = f"fla not importable ({type(exc).__name__}: {exc})"

    def supports(self, problem: Problem) -> str | None:
        if self.missing:
            return self.missing
        if problem.cache_steps is not None:
            return "FLA has no intermediate-state output"
        if problem.disable_state_update:
            return "FLA has no verify mode"
        return None

    def adapt(self, problem: Problem) -> Problem:
        # No pool or slot indices: it reads a dense per-batch state.
        return problem.with_(pool_size=None, padded_rows=(), separate_write_slots=False)

    def bind(self, problem: Problem, args: dict) -> Bound:
        fn = self.fn
        state = args["state"]
        holder: dict = {}
        kwargs = dict(
            q=args["q"], k=args["k"], v=args["v"], g=args["a"], beta=args["b"],
            A_log=args["A_log"], dt_bias=args["dt_bias"], scale=problem.K**-0.5,
            initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            state_v_first=problem.layout == "k_last",
        )  # fmt: skip

        def run():
            holder["out"], holder["final"] = fn(**kwargs)

        return Bound(
            run=run,
            read_output=lambda: holder["out"],
            read_state=lambda: holder["final"],
            slots=None,
        )


def peers() -> list[Impl]:
    return [FlashInfer(), FLA()]
