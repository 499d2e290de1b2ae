"""Jinja templates of the rendered Volcano Job, train.sh and the pod scripts (package data).

The bundled ``bootstrap.sh`` is no template: it ships from ``scripts/`` (``npu_job.scripts``).
"""
