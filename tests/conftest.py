"""What every test gets: the ``npu_job`` logger as it was before the test.

A command run in-process (``npu_job.cli.main``, npu-run's ``main``) sends that logger to its own
stderr handler and stops it propagating, as a command should; left so, pytest's ``caplog`` of a
later test would see nothing, and the outcome of a test would depend on which ran before it.
"""

from __future__ import annotations

import logging
from typing import Iterator

import pytest


@pytest.fixture(autouse=True)
def _npu_job_logger_restored() -> Iterator[None]:
    logger = logging.getLogger("npu_job")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    handlers, level, propagate = saved
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate
