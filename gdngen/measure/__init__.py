"""The measurement core that ``gdngen bench`` and ``gdngen tune`` share: implementations bound to
random problems (:mod:`.impls`), the reference check (:mod:`.check`), side-by-side timing of CUDA
graphs (:mod:`.timing`), turns on a shared GPU (:mod:`.gpu_turns`), the environment record
(:mod:`.environment`), and vLLM's kernels of its decode chain, taken from its wheel
(:mod:`.vllm_source`) and loaded without vLLM (:mod:`.vllm_kernels`). It imports neither
bench nor tune (docs/design.md, "Architecture")."""
