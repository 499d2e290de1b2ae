"""The pod-side bootstrap: rank table + switch topology -> routing-affine node ranks.

Runs in every pod before training and must never import torch. Layers: ``model`` (dataclasses),
readers (pure bytes -> model), ``planner`` and ``scorer`` (pure), sources (file/HTTP/Kubernetes
I/O) and writers (atomic files) at the edges.
"""
