"""The pod-side bootstrap: rank table + switch topology -> routing-affine node ranks.

Runs in every pod before training and must never import torch. Layers: ``model`` (dataclasses,
``columns`` builds many fast), readers (pure bytes -> model: ``payload`` finds the document in an
input, ``jsondecode`` decodes JSON, ``fields`` checks its fields, ``ranktable`` and ``topology``
read them), ``planner`` and ``scorer`` (pure), sources (file/HTTP/Kubernetes I/O) and writers
(atomic files) at the edges; ``run`` is the whole run.
"""
