"""Jinja templates of the rendered Volcano Job, train.sh and the pod scripts (package data)."""
