"""``python -m npu_job.launcher``: the same as the ``npu-run`` console script."""

from .run import console_main

if __name__ == "__main__":
    console_main()
