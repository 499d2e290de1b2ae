"""The job kinds npu-job renders, routes and launches: one module each, registered here.

``KINDS`` maps the job spec's ``kind`` value to the kind's record (:class:`.base.JobKind`).
Adding a kind is its module (with its job object's template in ``npu_job/render/templates``) and
its line below.
"""

from __future__ import annotations

import importlib
from typing import Dict, Iterator, MutableMapping, Tuple

from npu_job.errors import InputError, shown

from .base import JobKind

#: Every kind, by its spec value, which is also its module's name here; in the order docs list
#: them. A kind's module is imported when the kind is first asked for, so a pod imports only its
#: own kind's, and a job's bundle may hold only that one (:func:`npu_job.bundle.pod_side_files`).
KIND_NAMES: Tuple[str, ...] = (
    "volcano",
    "indexedjob",
    "leaderworkerset",
    "jobset",
    "pytorchjob",
    "trainjob",
    "ascendjob",
)
DEFAULT = "volcano"
#: The environment variable render sets on a pod of any kind but the default, naming its kind.
KIND_ENV = "NPU_JOB_KIND"


class _Registry(MutableMapping[str, JobKind]):
    """The records by name, each imported on first use; a kind registered at run time (a test's)
    sits beside them."""

    def __init__(self) -> None:
        self._added: Dict[str, JobKind] = {}

    def __getitem__(self, name: str) -> JobKind:
        if name in self._added:
            return self._added[name]
        if name not in KIND_NAMES:
            raise KeyError(name)
        kind: JobKind = importlib.import_module(f"{__name__}.{name}").KIND
        return kind

    def __contains__(self, name: object) -> bool:
        # known without importing the module (Mapping's own would import it)
        return name in self._added or name in KIND_NAMES

    def __setitem__(self, name: str, kind: JobKind) -> None:
        self._added[name] = kind

    def __delitem__(self, name: str) -> None:
        del self._added[name]

    def __iter__(self) -> Iterator[str]:
        return iter((*KIND_NAMES, *(name for name in self._added if name not in KIND_NAMES)))

    def __len__(self) -> int:
        return len(set(KIND_NAMES) | set(self._added))


KINDS: MutableMapping[str, JobKind] = _Registry()


def kind_named(name: str, source: str, field: str) -> JobKind:
    """The kind called ``name``; an unknown one is an :class:`InputError` listing the known."""
    if name in KINDS:
        try:
            return KINDS[name]
        except ImportError:  # a job's bundle holds only its own kind
            raise InputError(
                source,
                field,
                f"expected the job's kind; {shown(name)} is not in this bundle of npu-job (a "
                "job's bundle holds only the kind it was rendered for)",
            ) from None
    raise InputError(
        source, field, f"expected a job kind, one of {', '.join(sorted(KINDS))}; got {shown(name)}"
    )
