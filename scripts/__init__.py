"""The pod's shell scripts, shipped as package data: ``bootstrap.sh`` (pod step 1).

The same file is installed on ``PATH`` (setup.cfg ``scripts``) and carried by ``npu-job render``
into every routed job's scripts ConfigMap (``npu_job.scripts``, read with importlib.resources).
"""
