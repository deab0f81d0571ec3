"""Random GDN decode problems: the inputs of one call, drawn fresh from a seed.

Tests and the benchmark both build their calls here, so that what is timed is what is checked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}


def state_of(args: dict):
    """The state a call updates: the dense ``state`` or the pool ``initial_state``."""
    return args["state"] if args["state"] is not None else args["initial_state"]


@dataclass(frozen=True)
class Problem:
    batch: int
    tokens: int = 1
    H: int = 16
    HV: int = 64
    K: int = 128
    V: int = 128
    layout: str = "k_last"
    state_dtype: str = "bf16"
    #: None: a dense per-batch state; else a pool with this many slots and slot indices
    pool_size: int | None = None
    index_dtype: str = "int32"
    #: write to other slots than the ones read (needs a pool)
    separate_write_slots: bool = False
    #: batch rows given a negative slot (padding)
    padded_rows: tuple[int, ...] = ()
    #: None: no intermediate states; else the buffer's dim 1 (>= tokens)
    cache_steps: int | None = None
    disable_state_update: bool = False
    use_qk_l2norm: bool = True
    io_dtype: str = "bf16"
    gate_dtype: str = "bf16"
    dt_bias_dtype: str = "fp32"
    scale: float | None = None
    seed: int = 0

    def with_(self, **changes) -> "Problem":
        return replace(self, **changes)

    @property
    def mode(self) -> str:
        """``update`` (final state written, no cache), ``verify`` (cache, no final write), or the
        two other combinations of the flags."""
        if self.cache_steps is not None and self.disable_state_update:
            return "verify"
        if self.cache_steps is None and not self.disable_state_update:
            return "update"
        return "cache+update" if self.cache_steps is not None else "no-write"

    @property
    def head_shape(self) -> tuple[int, int]:
        return (self.V, self.K) if self.layout == "k_last" else (self.K, self.V)

    def state_bytes(self) -> int:
        return 2 if self.state_dtype == "bf16" else 4

    def moved_bytes(self) -> int:
        """Bytes a call must move at least (docs/design.md, "Measuring")."""
        B, T = self.batch, self.tokens
        state = B * self.HV * self.V * self.K * self.state_bytes()
        writes = 0 if self.disable_state_update else 1
        cached = T if self.cache_steps is not None else 0
        io = B * T * (2 * self.H * self.K + 2 * self.HV * self.V + 2 * self.HV) * 2
        return state * (1 + writes + cached) + io

    def make(self, device: str | torch.device = "cuda") -> dict:
        """Keyword arguments of gdn_decode, freshly drawn on ``device`` from ``seed``."""
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(self.seed)
        B, T, H, HV, K, V = self.batch, self.tokens, self.H, self.HV, self.K, self.V
        io = TORCH_DTYPES[self.io_dtype]

        def randn(*shape, dtype=torch.float32, std=1.0):
            return (torch.randn(*shape, generator=gen, device=device) * std).to(dtype)

        q = randn(B, T, H, K, dtype=io)
        k = randn(B, T, H, K, dtype=io)
        v = randn(B, T, HV, V, dtype=io)
        a = randn(B, T, HV, dtype=TORCH_DTYPES[self.gate_dtype], std=2.0)
        b = randn(B, T, HV, dtype=TORCH_DTYPES[self.gate_dtype], std=2.0)
        if B * T * HV > 1:
            # Exercise the linear branch of softplus (x > 20) as well.
            a.view(-1)[:: max(1, (B * T * HV) // 3)] = 25.0
        A_log = torch.log(torch.rand(HV, generator=gen, device=device) * 15 + 1)
        dt_bias = randn(HV, dtype=TORCH_DTYPES[self.dt_bias_dtype], std=0.5)

        slots = self.pool_size if self.pool_size is not None else B
        state_dtype = TORCH_DTYPES[self.state_dtype]
        pool = randn(slots, HV, *self.head_shape, dtype=state_dtype, std=0.5)
        args = dict(q=q, k=k, v=v, A_log=A_log, a=a, dt_bias=dt_bias, b=b)
        args["scale"] = self.scale
        args["use_qk_l2norm"] = self.use_qk_l2norm
        args["disable_state_update"] = self.disable_state_update
        args["state_layout"] = self.layout
        index_dtype = INDEX_DTYPES[self.index_dtype]
        if self.pool_size is None:
            if self.padded_rows or self.separate_write_slots:
                raise ValueError("padding and separate write slots need a pool")
            args["state"] = pool
        else:
            need = B * (2 if self.separate_write_slots else 1)
            if need > self.pool_size:
                raise ValueError(f"pool_size {self.pool_size} < {need} slots needed")
            perm = torch.randperm(self.pool_size, generator=gen, device=device)
            reads = perm[:B].clone()
            writes = perm[B : 2 * B].clone() if self.separate_write_slots else None
            for row in self.padded_rows:
                reads[row] = -1
                if writes is not None:
                    writes[row] = -1
            args["state"] = None
            args["initial_state"] = pool
            args["initial_state_indices"] = reads.to(index_dtype)
            if writes is not None:
                args["output_state_indices"] = writes.to(index_dtype)
        if self.cache_steps is not None:
            if self.cache_steps < T:
                raise ValueError("cache_steps must be >= tokens")
            # Poisoned, so that a test sees exactly which entries the kernel wrote.
            args["intermediate_states_buffer"] = torch.full(
                (B, self.cache_steps, HV, *self.head_shape),
                float("nan"),
                dtype=state_dtype,
                device=device,
            )
        return args
