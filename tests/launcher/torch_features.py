"""What the launcher tests need to know of the installed torch (they run on 2.1 through 2.14).

The product asks :mod:`npu_job.launcher.torchcompat`; the tests use the same answers to read a
rendezvous result in either shape and to skip what a release cannot do at all, saying which
feature is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from npu_job.launcher import torchcompat


@dataclass(frozen=True)
class Joined:
    """One node's rendezvous result, whatever shape this torch's agent expects."""

    store: Any
    rank: int
    world_size: int
    master_addr: str  # where this node's workers find their store
    master_port: int


def joined(result: Any) -> Joined:
    """Read ``next_rendezvous()``'s result: ``RendezvousInfo`` (2.4+) or the older tuple."""
    if isinstance(result, BaseException):
        raise result
    if isinstance(result, tuple):
        store, rank, world_size = result
        return Joined(
            store,
            rank,
            world_size,
            store.get("MASTER_ADDR").decode(),
            int(store.get("MASTER_PORT")),
        )
    info = result.bootstrap_store_info
    return Joined(result.store, result.rank, result.world_size, info.master_addr, info.master_port)


def needs(feature: str) -> pytest.MarkDecorator:
    """Skip unless the installed torch has ``feature`` (a name from ``torchcompat.describe()``)."""
    present = dict(torchcompat.describe())[feature]
    return pytest.mark.skipif(not present, reason=f"this torch has no {feature}")


def store_errors() -> tuple:
    """What a failed store call raises on this torch (DistError from 2.2, RuntimeError before)."""
    return (torchcompat.StoreError, RuntimeError)
