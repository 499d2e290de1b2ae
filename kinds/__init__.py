"""The job kinds npu-job renders, routes and launches: one module each, registered here.

``KINDS`` maps the job spec's ``kind`` value to the kind's record (:class:`.base.JobKind`).
Adding a kind is its module (with its job object's template in ``npu_job/render/templates``) and
its line below.
"""

from __future__ import annotations

from typing import Dict

from npu_job.errors import InputError, shown

from . import ascendjob, indexedjob, jobset, leaderworkerset, pytorchjob, trainjob, volcano
from .base import JobKind

DEFAULT = volcano.KIND.name
#: The environment variable render sets on a pod of any kind but the default, naming its kind.
KIND_ENV = "NPU_JOB_KIND"

KINDS: Dict[str, JobKind] = {
    kind.name: kind
    for kind in (
        volcano.KIND,
        indexedjob.KIND,
        leaderworkerset.KIND,
        jobset.KIND,
        pytorchjob.KIND,
        trainjob.KIND,
        ascendjob.KIND,
    )
}


def kind_named(name: str, source: str, field: str) -> JobKind:
    """The kind called ``name``; an unknown one is an :class:`InputError` listing the known."""
    kind = KINDS.get(name)
    if kind is None:
        raise InputError(
            source,
            field,
            f"expected a job kind, one of {', '.join(sorted(KINDS))}; got {shown(name)}",
        )
    return kind
