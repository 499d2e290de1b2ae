"""Fixtures of the bootstrap's tests."""

from __future__ import annotations

import logging
from typing import Callable, Iterator, List

import pytest


@pytest.fixture
def logs() -> Iterator[Callable[..., List[str]]]:
    """The messages the ``npu_job`` loggers emit during the test: ``logs()`` (INFO and up) or
    ``logs(level)``."""
    records: List[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("npu_job")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield lambda level=logging.INFO: [r.getMessage() for r in records if r.levelno >= level]
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.fixture
def test_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test-only job kinds of tests/bootstrap/testkind.py in npu-job's registry, as a kind
    module's registry line puts one there (``NPU_JOB_KIND=numbered`` then names it)."""
    from npu_job import kinds

    from .testkind import NO_DNS, NUMBERED

    for kind in (NUMBERED, NO_DNS):
        monkeypatch.setitem(kinds.KINDS, kind.name, kind)
