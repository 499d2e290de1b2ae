"""Jinja templates of the rendered Volcano Job, train.sh and the pod scripts (package data).

Also ships, as symlinks whose content wheels store: ``bootstrap.sh`` (``scripts/``) and the demo's
workload ``train_ddp.py`` (``examples/``).
"""
