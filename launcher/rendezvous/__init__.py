"""The ``parallel`` rendezvous backend: one plan per round (static or elastic), faults named.

Its handler and what it owns are told in :mod:`.handler`; the entry point plain torchrun loads is
:mod:`.torchrun_plugin`. This file imports nothing: torch's registry loads that entry point while
torch itself is being imported.
"""
