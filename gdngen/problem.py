"""Random GDN decode problems: the inputs of one call, drawn fresh from a seed.

Tests and the benchmark both build their calls here, so that what is timed is what is checked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from gdngen.reference.state_formats import STORAGE_DTYPES, store
from gdngen.terms import SCALED_STATE_DTYPES, SCALED_STATE_FORMATS, STATE_BYTES

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}


def state_of(args: dict):
    """The state a call updates: the dense ``state`` or the pool ``initial_state``."""
    return args["state"] if args["state"] is not None else args["initial_state"]


def state_copy(args: dict, slots: torch.Tensor | None = None) -> torch.Tensor:
    """A copy of the call's state (only its ``slots``, where given) as the reference reads it: a
    quantized pool's values times their ``state_scales`` (fp32), any other state as it is."""
    state = state_of(args)
    scales = args.get("state_scales")
    if slots is not None:
        state, scales = state[slots], None if scales is None else scales[slots]
    if scales is None:
        return state.clone()
    return state.float() * scales[..., None]


def element_bytes(state_dtype: str, K: int) -> float:
    """Bytes per state element of ``state_dtype`` in rows of ``K``: a quantized state's fp32 scale
    a row spread over its values."""
    return STATE_BYTES[state_dtype] + (4 / K if state_dtype in SCALED_STATE_DTYPES else 0)


def token_io_bytes(tokens: int, H: int, HV: int, K: int, V: int) -> int:
    """Bytes of ``tokens`` tokens' 16-bit inputs and outputs: q and k, v and the output, a and b."""
    return tokens * (2 * H * K + 2 * HV * V + 2 * HV) * 2


def _drawn_pool(randn, shape: tuple, state_dtype: str) -> tuple[torch.Tensor, dict]:
    """A pool of ``shape`` drawn by ``randn`` in ``state_dtype`` (a quantized dtype drawn in fp32
    and stored with its row scales), and the call's keywords that go with it (a quantized pool's
    ``state_scales``)."""
    pool = randn(*shape, dtype=TORCH_DTYPES.get(state_dtype, torch.float32), std=0.5)
    if state_dtype not in SCALED_STATE_DTYPES:
        return pool, {}
    stored = store(pool, SCALED_STATE_FORMATS[state_dtype])
    return stored.values, {"state_scales": stored.scales}


#: the storage dtypes of the quantized states (int8, float8_e4m3fn)
_SCALED_STORAGE = {STORAGE_DTYPES[fmt] for fmt in SCALED_STATE_FORMATS.values()}


def verify_cache(shape: tuple, pool: torch.Tensor) -> dict:
    """A verify cache of ``shape`` in the pool's dtype, poisoned so that a test sees exactly
    which entries a kernel wrote: NaN, or -128 in an int8 cache (a row quantizes to +-127 at
    most); a quantized cache with its rows' scales beside it, NaN (docs/design.md, "Quantized
    state")."""
    poison = -128 if pool.dtype == torch.int8 else float("nan")
    cache = torch.full(shape, poison, dtype=pool.dtype, device=pool.device)
    if pool.dtype not in _SCALED_STORAGE:
        return {"intermediate_states_buffer": cache}
    scales = torch.full(shape[:-1], float("nan"), dtype=torch.float32, device=pool.device)
    return {"intermediate_states_buffer": cache, "intermediate_states_scales": scales}


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

    def state_bytes(self) -> float:
        """Bytes per state element (a quantized state's fp32 scale per row of K included)."""
        return element_bytes(self.state_dtype, self.K)

    def moved_bytes(self) -> int:
        """Bytes a call must move at least (docs/design.md, "Measuring")."""
        B, T = self.batch, self.tokens
        state = B * self.HV * self.V * self.K * self.state_bytes()
        writes = 0 if self.disable_state_update else 1
        cached = T if self.cache_steps is not None else 0
        io = token_io_bytes(B * T, self.H, self.HV, self.K, self.V)
        return int(state * (1 + writes + cached) + io)

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
        pool, scaled = _drawn_pool(randn, (slots, HV, *self.head_shape), self.state_dtype)
        args = dict(q=q, k=k, v=v, A_log=A_log, a=a, dt_bias=dt_bias, b=b, **scaled)
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
            args.update(verify_cache((B, self.cache_steps, HV, *self.head_shape), pool))
        return args


@dataclass(frozen=True)
class PackedProblem:
    """An engine-form call (docs/design.md, "Call forms"): sequences packed along one token
    dimension with ``cu_seqlens``, drawn fresh from a seed.

    ``slots="per_token"`` is vLLM's speculative-decode form: a [N, 1 + S] slot table (1 + S =
    ``tokens``, row stride padded by ``extra_columns``) with ``num_accepted_tokens`` and the
    padding sentinel ``null_slot``; ``wide_table`` adds live columns past ``tokens`` (1 + S >
    max_seqlen), which only initial states are read from; ``slots="row"`` gives [N] indices. ``cache="rows"`` is SGLang's
    verify form: a pool-row intermediate buffer of ``cache_rows`` rows named per sequence.
    ``mixed_lengths`` draws each sequence's length from 1..tokens (the first padded row gets 0);
    otherwise every sequence has ``tokens`` tokens. ``buffer_tokens`` sizes the token buffer
    past ``cu_seqlens[-1]`` (unused tokens after the live ones, as an engine pads its token
    buffer to a captured size); ``uniform_seqlen`` passes the caller's promise that sequence n
    starts at n * tokens. ``flat`` passes q/k/v as [total, heads, dim],
    ``mixed_qkv`` as one [total, 2*H*K + HV*V] buffer (a, b as row-strided [total, HV] views).
    """

    sequences: int
    tokens: int
    H: int = 16
    HV: int = 64
    K: int = 128
    V: int = 128
    layout: str = "k_last"
    state_dtype: str = "bf16"
    index_dtype: str = "int32"
    slots: str = "per_token"
    null_slot: int = 0
    padded_rows: tuple[int, ...] = ()
    mixed_lengths: bool = False
    cache: str = "none"
    cache_rows: int | None = None
    disable_state_update: bool = False
    flat: bool = False
    mixed_qkv: bool = False
    extra_columns: int = 0
    wide_table: int = 0
    pool_size: int | None = None
    buffer_tokens: int | None = None
    uniform_seqlen: bool = False
    seed: int = 0

    def with_(self, **changes) -> "PackedProblem":
        return replace(self, **changes)

    @property
    def head_shape(self) -> tuple[int, int]:
        return (self.V, self.K) if self.layout == "k_last" else (self.K, self.V)

    @property
    def batch(self) -> int:
        """The call's rows: its packed sequences."""
        return self.sequences

    def state_bytes(self) -> float:
        """Bytes per state element (a quantized state's fp32 scale per row of K included)."""
        return element_bytes(self.state_dtype, self.K)

    def moved_bytes(self) -> int:
        """Bytes a call must move at least: each sequence's state read once, and stored once a
        token (per-token slots) or once (a slot a row), with the tokens' inputs and outputs."""
        N, T = self.sequences, self.tokens
        state = N * self.HV * self.V * self.K * self.state_bytes()
        stores = T if self.slots == "per_token" and not self.disable_state_update else 1
        io = token_io_bytes(N * T, self.H, self.HV, self.K, self.V)
        return int(state * (1 + stores) + io)

    def make(self, device: str | torch.device = "cuda") -> dict:
        """Keyword arguments of gdn_decode."""
        device = torch.device(device)
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        N, T, H, HV, K, V = self.sequences, self.tokens, self.H, self.HV, self.K, self.V
        index = INDEX_DTYPES[self.index_dtype]
        if self.mixed_lengths:
            lengths = torch.randint(1, T + 1, (N,), generator=gen)
            if self.padded_rows:
                lengths[self.padded_rows[0]] = 0
        else:
            lengths = torch.full((N,), T)
        cu = torch.zeros(N + 1, dtype=torch.int64)
        cu[1:] = lengths.cumsum(0)
        total = max(int(cu[-1]), 1)
        if self.buffer_tokens is not None:
            if self.buffer_tokens < total:
                raise ValueError(
                    f"buffer_tokens: expected at least the {total} tokens of the sequences; "
                    f"got {self.buffer_tokens}"
                )
            total = self.buffer_tokens

        def randn(*shape, dtype=torch.bfloat16, std=1.0):
            return (torch.randn(*shape, generator=gen) * std).to(dtype).to(device)

        args = dict(scale=None, use_qk_l2norm=True, state_layout=self.layout)
        width = 2 * H * K + HV * V
        if self.mixed_qkv:
            # A post-convolution buffer with room to spare in each row (a real one is a view).
            mixed = randn(total, width + 64)[:, :width]
            args["mixed_qkv"] = mixed if self.flat else mixed[None]
        else:
            shape = (total,) if self.flat else (1, total)
            args["q"] = randn(*shape, H, K)
            args["k"] = randn(*shape, H, K)
            args["v"] = randn(*shape, HV, V)
        gates = randn(total, 2 * HV, std=2.0)  # a and b side by side, as a projection gives them
        gates[::3, 0] = 25.0  # the linear branch of softplus
        a, b = gates[:, :HV], gates[:, HV:]
        args["a"], args["b"] = (a, b) if self.flat or self.mixed_qkv else (a[None], b[None])
        args["A_log"] = torch.log(torch.rand(HV, generator=gen) * 15 + 1).to(device)
        args["dt_bias"] = randn(HV, dtype=torch.float32, std=0.5)

        columns = T + self.wide_table if self.slots == "per_token" else 1
        pool_size = self.pool_size or N * columns + 8
        # The pool (per-token forms hold B * T states: 4.3 G values at B = 512, T = 8, HV = 64)
        # is drawn where it lives, by a generator of its own: drawn on the host it took most of
        # a large cell's bench time.
        pool_gen = torch.Generator(device=device).manual_seed(self.seed)

        def pool_randn(*shape, dtype=torch.bfloat16, std=1.0):
            return (torch.randn(*shape, generator=pool_gen, device=device) * std).to(dtype)

        pool, scaled = _drawn_pool(pool_randn, (pool_size, HV, *self.head_shape), self.state_dtype)
        perm = torch.randperm(pool_size - 1, generator=gen)[: N * columns] + 1  # slot 0: null
        args.update(initial_state=pool, state=None, null_slot=self.null_slot, **scaled)
        pad = min(self.null_slot, -1) if self.null_slot < 0 else self.null_slot
        if self.slots == "per_token":
            table = torch.full((N, columns + self.extra_columns), pad, dtype=torch.int64)
            table[:, :columns] = perm.view(N, columns)
            # Every value 1..1 + S in turn, so that a batch of >= 1 + S rows covers them all.
            accepted = torch.arange(N) % columns + 1
            for row in self.padded_rows:
                table[row] = pad
                accepted[row] = 1
            args["initial_state_indices"] = table.to(index).to(device)
            if self.extra_columns:  # a view of a wider table: rows strided, columns dense
                args["initial_state_indices"] = args["initial_state_indices"][:, :columns]
            args["num_accepted_tokens"] = accepted.to(index).to(device)
        else:
            reads = perm[:N].clone()
            for row in self.padded_rows:
                reads[row] = pad
            args["initial_state_indices"] = reads.to(index).to(device)
        if self.cache != "none":
            rows = self.cache_rows or N if self.cache == "rows" else N
            args.update(verify_cache((rows, T, HV, *self.head_shape), pool))
            if self.cache == "rows":
                picks = torch.randperm(rows, generator=gen)[:N]
                for row in self.padded_rows:
                    picks[row] = pad
                args["intermediate_state_indices"] = picks.to(index).to(device)
        args["disable_state_update"] = self.disable_state_update
        args["cu_seqlens"] = cu.to(index).to(device)
        args["max_seqlen"] = T
        if self.uniform_seqlen:
            args["uniform_seqlen"] = True
        return args
