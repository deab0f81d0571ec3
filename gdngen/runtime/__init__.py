"""What every generated call runs on: input checks, the call path and its signature cache, where a
compiled kernel comes from (memory, ahead-of-time artifacts, the disk cache, JIT), warm-up and
``gdngen build``, and the resource checks of the compile test (docs/design.md, "Call forms")."""
