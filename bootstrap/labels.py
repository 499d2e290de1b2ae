"""Switch placement from a Kubernetes node's labels (pure): the one place that knows the keys.

* ``cce.kubectl.kubernetes.io/cabinet`` (Huawei Cloud CCE): the node's ToR IPs joined by ``-``;
  several when its NICs reach several ToRs.
* Volcano's HyperNode auto-discovery labels (volcano-sh/volcano
  ``docs/user-guide/how_to_use_hypernode_auto_discovery.md``): ``volcano.sh/tor`` (the ToR of an
  Ascend 910B node), else ``volcano.sh/hypernode`` (the super node of an A3 node), under
  ``volcano.sh/hypercluster`` as the outer tier.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

from npu_job.bootstrap.model import Placement
from npu_job.bootstrap.payload import expect_str

CABINET_LABEL = "cce.kubectl.kubernetes.io/cabinet"
VOLCANO_TOR_LABEL = "volcano.sh/tor"
VOLCANO_HYPERNODE_LABEL = "volcano.sh/hypernode"
VOLCANO_HYPERCLUSTER_LABEL = "volcano.sh/hypercluster"


def placement_from_labels(labels: Mapping[str, Any], source: str, path: str) -> Optional[Placement]:
    """Where the node with these labels sits, or None when no topology label is set."""

    def label(key: str) -> str:
        value = labels.get(key)
        if value is None:
            return ""
        return expect_str(value, source, f"{path}.{key}", empty_ok=True)

    cabinet = label(CABINET_LABEL)
    tors: Tuple[str, ...] = tuple(part for part in cabinet.split("-") if part)
    if not tors:
        tor = label(VOLCANO_TOR_LABEL) or label(VOLCANO_HYPERNODE_LABEL)
        tors = (tor,) if tor else ()
    if not tors:
        return None
    hypercluster = label(VOLCANO_HYPERCLUSTER_LABEL)
    return Placement(tiers=(hypercluster,) if hypercluster else (), tors=tors)
