"""Example job specs and ``train_ddp.py``, the small DDP training the demo runs in its pods.

A package only so that an installed npu-job carries ``train_ddp.py`` (``npu_job.examples``): the
demo reads it from there, in a wheel install as in a source checkout.
"""
