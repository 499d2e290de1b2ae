"""Waiting for the rank table to become ``completed`` (clock and sleep are passed in).

The platform writes ``{"status": "initializing"}`` first and fills the table once every pod is
placed; ConfigMap volumes swap the whole file atomically, up to about a minute late. So each poll
re-reads the whole source. What counts as "not ready yet" (keep polling):

* status other than ``completed``;
* a source that is temporarily unreachable (:class:`~npu_job.bootstrap.sources.SourceUnavailable`);
* bytes that do not decode, or a table that does not validate while its status is not
  ``completed``: it may still be changing.

A *completed* table that fails validation will not fix itself: that error is raised at once. On
timeout, a decoding error is raised as the :class:`InputError` it is (it says what is wrong with
the file); otherwise a :class:`NotReadyError` says what was last seen.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

from npu_job.errors import InputError, NotReadyError, shown
from npu_job.polling import Backoff, poll

from .base.model import RankTable
from .base.payload import decode_document
from .ranktable import rank_table_from_document
from .sources import SourceUnavailable

log = logging.getLogger(__name__)


class LoadedRankTable(NamedTuple):
    """A completed rank table with the document it came from (for the reordered copy)."""

    table: RankTable
    document: Any
    source: str


def wait_for_rank_table(
    fetch: Callable[[], bytes],
    source: str,
    *,
    timeout: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> LoadedRankTable:
    """Poll ``fetch`` until the rank table it returns is completed; see the module docstring."""
    seen: List[Tuple[str, Optional[InputError]]] = []

    def attempt() -> Optional[LoadedRankTable]:
        loaded, last_seen, last_error = _attempt(fetch, source)
        seen[:] = [(last_seen, last_error)]
        return loaded

    def progress(elapsed: float) -> None:
        log.info("waiting for rank table: %s, %.0f s of %.0f s", seen[0][0], elapsed, timeout)

    loaded = poll(
        attempt, timeout, Backoff.fixed(interval), tick=progress, clock=clock, sleep=sleep
    )
    if loaded is not None:
        return loaded
    last_seen, last_error = seen[0]
    if last_error is not None:  # the bytes never decoded: say what is wrong with them
        last_error.tip = f"it stayed like this for {timeout:.0f} s (NPU_JOB_WAIT_TIMEOUT)"
        raise last_error
    raise NotReadyError(
        f'{source}: status: expected "completed" within {timeout:.0f} s, last seen {last_seen}',
        tip="raise NPU_JOB_WAIT_TIMEOUT (or --wait-timeout) if the platform is slow to fill "
        "the rank table",
    )


def _attempt(
    fetch: Callable[[], bytes], source: str
) -> Tuple[Optional[LoadedRankTable], str, Optional[InputError]]:
    """One poll: (the table if completed, what was seen, the error if it did not decode)."""
    try:
        data = fetch()  # a missing file, a 404 or a bad certificate raises: polling will not help
    except SourceUnavailable as error:
        return None, f"unreachable ({error.message})", None
    try:
        document = decode_document(data, source)
    except InputError as error:
        return None, f"does not parse yet ({error.message})", error
    status = document.get("status") if isinstance(document, dict) else None
    try:
        table = rank_table_from_document(document, source)
    except InputError as error:
        if status == "completed":
            raise
        return None, f"status={shown(status)}, not valid yet ({error.message})", None
    if table.is_completed:
        return LoadedRankTable(table, document, source), "status=completed", None
    return None, f"status={shown(table.status)}", None
