"""The measurement core that ``gdngen bench`` and ``gdngen tune`` share: implementations bound to
random problems (:mod:`.impls`), the reference check (:mod:`.check`), side-by-side timing of CUDA
graphs (:mod:`.timing`), turns on a shared GPU (:mod:`.gpu_turns`) and the environment record
(:mod:`.environment`). It imports neither of them (docs/design.md, "Architecture")."""
