"""The pod-side bootstrap: rank table + switch topology -> routing-affine node ranks.

Runs in every pod before training and must never import torch. Layers: ``base``, the floor
(``model``'s dataclasses, ``columns`` builds many fast; ``payload`` finds the document in an
input, ``jsondecode`` decodes JSON, ``fields`` checks its fields), readers (pure bytes -> model:
``ranktable`` and ``topology``, the cluster's objects in ``kube``), ``planner`` and ``scorer``
(pure), sources (file/HTTP/Kubernetes I/O) and writers (atomic files) at the edges; ``run`` is the
whole run. Most records outside ``model`` are
NamedTuples: every pod defines them before it plans, and a frozen dataclass costs ~0.5 ms of CPU
to define (it compiles six methods), a NamedTuple a quarter of that.
"""
