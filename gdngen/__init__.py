"""gdngen: GPU kernels for the Gated Delta Net decode step, generated from declarative specs.

Layout (docs/design.md, "Architecture"): ``gdngen.spec`` (pydantic spec models), ``gdngen.dispatch``
(rules, the one matcher, coverage and the verdict policy), ``gdngen.templates`` and
``gdngen.emit`` (spec -> files under generated/), ``gdngen.device`` (trace-time helpers the
generated kernels import), ``gdngen.runtime`` (checks, compile cache and launch behind every
generated call), ``gdngen.measure`` (the measurement core of ``gdngen.bench`` and ``gdngen.tune``)
and ``gdngen.reference`` (the float64 reference every test and benchmark compares with).
"""

__version__ = "0.1.0"
