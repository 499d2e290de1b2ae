"""What a pod runs from the job's bundle: its entry point (:mod:`.bundled`).

The entry point checks the bundle, then runs the bootstrap or npu-run, so it imports both parts:
it sits above them, where the CLI does, and not in ``npu_job/`` itself, the small core that both
parts import and that may import neither. It is not in :mod:`npu_job.cli` either: the bundle holds
the pod side only, whole packages of it, and the CLI is not part of that. So it is a package of
its own, which the bundle holds whole beside the bootstrap and the launcher.
"""
