"""The cells of the fused MTP bench (gdngen.bench.mtp) and their inputs: the arguments of vLLM's
fused speculative-decode op ``fused_gdn_decode_post_conv_mtp`` as vLLM 0.33's GDN layer passes
them in plain MTP decode (``_forward_core_decode_spec_post_conv_fused_norm`` of
vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py), under CUDA graphs:

- every request is a spec decode of ``1 + S`` tokens (the target token and S drafts), packed by
  ``cu_seqlens = [0, 1 + S, 2 (1 + S), ...]`` (int32, as ``spec_query_start_loc``);
- ``mixed_qkv [tokens, 2*H*K + HV*V]`` is the conv's output written over its input, a column view
  of the projection's ``qkvz`` rows, and ``output_gate [tokens, HV, V]`` is the rest of those rows;
- ``b``, ``a [tokens, HV]`` are the two halves of the ``ba`` projection (row-strided views);
- ``state [slots, HV, V, K]`` is the layer's pool; ``state_indices [N, 1 + S]`` (int32, the
  graph's persistent table, dense) names distinct slots, none of them the null block 0, so that
  every token's state lands in a slot of its own; ``num_accepted_tokens [N]`` takes every value
  1 .. 1 + S in turn, shifted by the set's seed;
- ``out [tokens, HV, V]`` is contiguous; ``scale = K ** -0.5``, ``norm_eps`` Qwen3.5's 1e-6, the
  gate's activation silu.

The geometry is Qwen3.5's (HV = 64) or Qwen3-Next's (HV = 32): H = 16 key heads, K = V = 128.
Everything is drawn on the given device from a generator of that device, so that a cell of a
few GiB of states is made in a moment (and a tiny cell on the CPU for tests).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from gdngen.problem import TORCH_DTYPES

#: the key heads and head dims of both served models
KEY_HEADS, HEAD_DIM = 16, 128
#: the models of each value-head count the bench serves (labels of the report)
MODELS = {32: "qwen3-next", 64: "qwen3.5"}
#: vLLM's padding slot (NULL_BLOCK_ID): no live row reads or writes it
NULL_SLOT = 0
#: Qwen3.5's and Qwen3-Next's ``rms_norm_eps``
NORM_EPS = 1e-6
ACTIVATION = "silu"
#: tokens per request vLLM's fused op takes (MAX_FUSED_GDN_MTP_TOKENS), and gdngen's h200 target
MAX_TOKENS = 8
STATE_DTYPES = ("bf16", "fp32")


@dataclass(frozen=True)
class MtpCell:
    """One cell: ``batch`` requests of ``tokens`` = 1 + S tokens each, HV value heads."""

    batch: int
    tokens: int
    HV: int
    state_dtype: str
    H: int = KEY_HEADS
    K: int = HEAD_DIM
    V: int = HEAD_DIM

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch: expected at least one request; got {self.batch}")
        if not 1 <= self.tokens <= MAX_TOKENS:
            raise ValueError(
                f"tokens: expected 1 + S in 1..{MAX_TOKENS} (vLLM's fused op); got {self.tokens}"
            )
        if self.HV < self.H or self.HV % self.H:
            raise ValueError(f"HV: expected a multiple of H={self.H}; got {self.HV}")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(
                f"state_dtype: expected one of {STATE_DTYPES}; got {self.state_dtype!r}"
            )

    @property
    def model(self) -> str:
        return MODELS.get(self.HV, f"HV={self.HV}")

    @property
    def total_tokens(self) -> int:
        return self.batch * self.tokens

    @property
    def conv_dim(self) -> int:
        return 2 * self.H * self.K + self.HV * self.V

    @property
    def slots(self) -> int:
        """The pool: one slot per token of every request, and the null block."""
        return self.total_tokens + 1

    def state_bytes(self) -> int:
        return self.HV * self.V * self.K * TORCH_DTYPES[self.state_dtype].itemsize

    def moved_bytes(self) -> int:
        """The bytes one call must move: each request's initial state read and every token's
        state written, each token's 16-bit rows (q, k, v, the output gate, the output, a, b)."""
        per_token = 2 * (self.conv_dim + 2 * self.HV * self.V + 2 * self.HV)
        return self.batch * (1 + self.tokens) * self.state_bytes() + self.total_tokens * per_token

    def footprint_bytes(self) -> int:
        """The bytes one input set holds (the pool and the token rows)."""
        return self.slots * self.state_bytes() + self.total_tokens * 2 * (
            self.conv_dim + 2 * self.HV * self.V + 2 * self.HV
        )


def cell_grid(batches, tokens, heads, dtypes) -> list[MtpCell]:
    """The cells in the order they run: state dtype, then HV, then 1 + S, then batch."""
    return [
        MtpCell(batch=batch, tokens=t, HV=HV, state_dtype=dtype)
        for dtype, HV, t, batch in itertools.product(dtypes, heads, tokens, batches)
    ]


def parameters(cell: MtpCell, device: str | torch.device, seed: int = 0) -> dict:
    """The layer's weights the op reads (shared by every input set of a cell): ``A_log``,
    ``dt_bias`` (fp32) and the norm's weight (bf16)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    HV = cell.HV
    return dict(
        A_log=torch.log(torch.rand(HV, generator=gen, device=device) * 15 + 1),
        dt_bias=torch.randn(HV, generator=gen, device=device) * 0.5,
        norm_weight=(1 + 0.1 * torch.randn(cell.V, generator=gen, device=device)).to(
            torch.bfloat16
        ),
    )


def mtp_set(cell: MtpCell, params: dict, seed: int, device: str | torch.device) -> dict:
    """One input set: the op's keyword arguments (vLLM's names), drawn from ``seed``."""
    gen = torch.Generator(device=device).manual_seed(1000 + seed)
    N, T, HV, V = cell.batch, cell.tokens, cell.HV, cell.V
    L = cell.total_tokens

    def randn(*shape, dtype=torch.bfloat16, std=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * std).to(dtype)

    qkvz = randn(L, cell.conv_dim + HV * V)
    mixed_qkv, gate = qkvz.split([cell.conv_dim, HV * V], dim=-1)
    ba = randn(L, 2 * HV, std=2.0)
    b, a = ba.chunk(2, dim=-1)
    state = randn(cell.slots, HV, V, cell.K, dtype=TORCH_DTYPES[cell.state_dtype], std=0.5)
    table = torch.randperm(L, generator=gen, device=device) + NULL_SLOT + 1
    rows = torch.arange(N, device=device)
    return dict(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=params["A_log"],
        dt_bias=params["dt_bias"],
        state_indices=table.view(N, T).to(torch.int32),
        cu_seqlens=(torch.arange(N + 1, device=device) * T).to(torch.int32),
        num_accepted_tokens=((rows + seed) % T + 1).to(torch.int32),
        state=state,
        output_gate=gate.unflatten(-1, (HV, V)),
        norm_weight=params["norm_weight"],
        out=torch.empty(L, HV, V, dtype=torch.bfloat16, device=device),
        scale=cell.K**-0.5,
        norm_eps=NORM_EPS,
        output_gate_activation=ACTIVATION,
    )


def written_slots(s: dict) -> torch.Tensor:
    """The slots a call on set ``s`` must write, sorted: every column of every request's table
    (each request has 1 + S tokens)."""
    return s["state_indices"].reshape(-1).long().sort().values


def copy_for_check(s: dict) -> dict:
    """``s`` with its own copies of what a call writes (the pool, and ``out`` filled with NaN, so
    that a row left unwritten shows)."""
    return dict(s, state=s["state"].clone(), out=torch.full_like(s["out"], float("nan")))
