"""``python -m npu_job``: the same as the ``npu-job`` command."""

from npu_job.cli import console_main

if __name__ == "__main__":
    console_main()
