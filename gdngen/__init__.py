"""gdngen: GPU kernels for the Gated Delta Net decode step, generated from declarative specs.

Layout: ``gdngen.spec`` (pydantic spec models), ``gdngen.templates`` (Jinja templates of the
kernels and of the dispatch table), ``gdngen.emit`` (spec -> files under generated/),
``gdngen.runtime`` (checks, compile cache and launch behind every generated call) and
``gdngen.reference`` (the float64 reference every test and benchmark compares with).
"""

__version__ = "0.1.0"
