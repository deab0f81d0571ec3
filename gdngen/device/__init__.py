"""Trace-time helpers that generated kernels import (docs/design.md, "Architecture").

Everything here runs while CuTe DSL traces a kernel, never at call time: the lane mapping of a
group (:mod:`.lanes`, pure Python, also read by the spec model to validate and describe
variants), a token's gates (:mod:`.gates`), the staged solve's product lists (:mod:`.staging`),
copies that carry cache operators (:mod:`.cache_copy`) and the host-side launch shared by every
kernel module (:mod:`.launch`).
Submodules that need CuTe DSL import it themselves, so ``gdngen.device.lanes`` stays cheap.
"""
