"""What each SM target offers a kernel: the facts the spec model checks variants against, and
the GPUs the runtime names when a call is on the wrong one (so it imports nothing heavy).

One row per target ``sm`` a spec may name (docs/design.md, "SM targets"). The numbers are the
per-SM limits of the CUDA compute capability; ``packed_fp32x2`` was read from the machine code
(ptxas 12.9 turns PTX ``fma.rn.f32x2`` into ``FFMA2`` on sm_100a and sm_103a, and into two scalar
``FFMA`` on sm_120a and sm_121a, which have no packed FMA unit).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SmFacts:
    #: the GPUs of this target, for messages and docs
    parts: str
    #: 32-bit registers of one SM, shared by the threads of its resident CTAs
    registers: int
    #: threads one SM holds at once
    threads: int
    #: shared memory one CTA may use, in bytes (the opt-in maximum)
    shared_per_cta: int
    #: a packed fp32x2 FMA/MUL instruction (the ``packed_fma`` knob pays only here)
    packed_fp32x2: bool


SM_FACTS: dict[str, SmFacts] = {
    "sm_90a": SmFacts(
        parts="Hopper: H100, H200, GH200",
        registers=65536,
        threads=2048,
        shared_per_cta=227 * 1024,
        packed_fp32x2=False,
    ),
    "sm_100a": SmFacts(
        parts="Blackwell: B200, GB200",
        registers=65536,
        threads=2048,
        shared_per_cta=227 * 1024,
        packed_fp32x2=True,
    ),
    "sm_103a": SmFacts(
        parts="Blackwell Ultra: B300, GB300",
        registers=65536,
        threads=2048,
        shared_per_cta=227 * 1024,
        packed_fp32x2=True,
    ),
    "sm_120a": SmFacts(
        parts="Blackwell GB202: RTX PRO 6000 Blackwell, RTX 5090",
        registers=65536,
        threads=1536,
        shared_per_cta=99 * 1024,
        packed_fp32x2=False,
    ),
    "sm_121a": SmFacts(
        parts="Blackwell GB10: DGX Spark",
        registers=65536,
        threads=1536,
        shared_per_cta=99 * 1024,
        packed_fp32x2=False,
    ),
}

#: targets with the packed fp32x2 FMA
PACKED_FMA_TARGETS = tuple(sm for sm, facts in SM_FACTS.items() if facts.packed_fp32x2)
#: the most threads any target's SM holds (a variant's own bound, before it meets a target)
MAX_THREADS_PER_SM = max(facts.threads for facts in SM_FACTS.values())
