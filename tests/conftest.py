"""What every test gets: the ``npu_job`` logger as it was before the test; how many workers
``-n auto`` starts (as many as the CPUs npu-run's ``--nproc_per_node=cpu`` counts:
:mod:`npu_job.launcher.cpus`); for timing tests marked so, a rerun after the machine itself
stalled; and pytest-timeout's hang catcher counted at the machine's pace (both
:mod:`tests.machine_stalls`, whose hooks these are).

A command run in-process (``npu_job.cli.main``, npu-run's ``main``) sends that logger to its own
stderr handler and stops it propagating, as a command should; left so, pytest's ``caplog`` of a
later test would see nothing, and the outcome of a test would depend on which ran before it.
"""

from __future__ import annotations

import logging
import os
from typing import Iterator, Optional

import pytest
from npu_job.launcher.cpus import usable_cpus

from tests.machine_stalls import (  # noqa: F401  (the hooks of the plugin)
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_terminal_summary,
    pytest_timeout_set_timer,
)


@pytest.fixture(autouse=True)
def _npu_job_logger_restored() -> Iterator[None]:
    logger = logging.getLogger("npu_job")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    handlers, level, propagate = saved
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook; plain pytest runs without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> Optional[int]:
    """``-n auto``: one worker per CPU this process may use, a container's CPU quota included."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own override, which its hook reads
    return usable_cpus()
