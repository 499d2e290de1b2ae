"""npu-job: routing-affine node ranks, Volcano Job rendering and a tiered launcher.

The package is split by where the code runs:

* ``npu_job.bootstrap`` runs inside every pod before training (no torch).
* ``npu_job.render`` (code and templates) turns a job spec into manifests (no torch).
* ``npu_job.launcher`` is ``npu-run``, the only part that imports torch.
* ``npu_job.cli`` is the thin ``npu-job`` command line over all of them.
"""

__version__ = "0.1.0"
