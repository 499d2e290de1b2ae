"""A job kind that is not Volcano's, for the tests of the bootstrap's kind-neutral paths.

Only the tests know it (the kinds npu-job ships have their own tests, tests/kinds): a made-up
controller that differs from the Volcano Job in every fact the bootstrap reads of a kind, so that
a Volcano fact left in the code fails a test. Its pods are labelled ``example.com/set-name`` (no
group label) and ``example.com/controller=numbered-set``, their index is the label
``example.com/set-index``, else the index their name ends in (``<set>-<index>``), and this pod's
index is ``$SET_INDEX``. :data:`NO_DNS` is the same controller giving its pods no DNS name.

:func:`as_numbered` turns a Volcano pod of the fixtures into the same pod made by this controller
(any other pod it leaves as it is).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional

from npu_job.kinds.base import JobKind, index_suffix

SET_LABEL = "example.com/set-name"
INDEX_LABEL = "example.com/set-index"
CONTROLLER = ("example.com/controller", "numbered-set")


class Numbered(JobKind):
    name = "numbered"
    title = "Numbered Set"
    job_label = SET_LABEL
    constant_labels = (CONTROLLER,)
    index_label = INDEX_LABEL
    index_env = "SET_INDEX"
    name_expected = "a pod name <set>-<index>"

    def index_from_name(self, name: str) -> Optional[int]:
        return index_suffix(name)

    def dns_name(self, job: str, group: str, index: int) -> str:
        return f"{job}-{index}.{job}"


class NoDNS(Numbered):
    name = "numbered-nodns"
    title = "Numbered Set without DNS"
    master_by_pod_ip = True

    def dns_name(self, job: str, group: str, index: int) -> str:
        return ""


NUMBERED = Numbered()
NO_DNS = NoDNS()


def as_numbered(pod: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of a Volcano pod of the fixtures as the numbered controller labels it: its job and
    index under the kind's labels, no ``volcano.sh/`` label left."""
    made = copy.deepcopy(pod)
    labels = made["metadata"].get("labels", {})
    if "volcano.sh/job-name" not in labels:
        return made  # no Volcano Job's pod (the fixtures' notebook)
    own = {SET_LABEL: labels["volcano.sh/job-name"], CONTROLLER[0]: CONTROLLER[1]}
    if "volcano.sh/task-index" in labels:
        own[INDEX_LABEL] = labels["volcano.sh/task-index"]
    kept = {key: value for key, value in labels.items() if not key.startswith("volcano.sh/")}
    made["metadata"]["labels"] = {**kept, **own}
    return made
