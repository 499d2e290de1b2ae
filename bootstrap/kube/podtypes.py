"""The msgspec types of the ``PodList`` fields the bootstrap reads (pure; nothing but typing).

:mod:`npu_job.bootstrap.kube.podpage` decodes the API's pages with them (it says why it stays now
that msgspec is optional). Each builder takes the msgspec module (loaded by the caller, only for
big inputs) and builds its decoder once.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, List, Optional, Union

# Bytes of memory pod_page_decoder builds per byte of page at most: every field it keeps is a
# string, a label map of strings or a view of the text (no field decodes any JSON value whole), so
# what it builds grows with the text alone. The worst measured is a pod of many two-letter labels
# (9x: a dict entry and a short str for each 8 bytes of ``"ab":"",``); tests/bootstrap/
# test_podpage.py measures the shapes. With it a page of up to 32 MiB fits the decoding cap
# uncounted: the API answers a job's pods in one page (its watch cache ignores ``limit``).
POD_PAGE_BUILDS_AT_MOST = 12


@lru_cache(maxsize=None)
def pod_page_decoder(msgspec: Any) -> Any:
    """msgspec's decoder of a ``PodList`` page into the fields :func:`.facts.read_pods` reads,
    each with the type it accepts (built once). What does not fit is refused, never coerced, and
    the page is then read the general way; unknown fields are skipped unbuilt."""
    struct = msgspec.defstruct
    text = Optional[str]
    # the containers' resources stay JSON text: podpage reads each distinct one once
    container = struct(
        "Container", [("resources", msgspec.Raw, msgspec.field(default_factory=msgspec.Raw))]
    )
    containers = Optional[List[container]]  # type: ignore[valid-type]
    spec = struct("Spec", [("nodeName", text, None), ("containers", containers, None)])
    status = struct(
        "Status", [("hostIP", text, None), ("podIP", text, None), ("phase", text, None)]
    )
    metadata = struct(
        "Metadata",
        [
            ("name", str),
            ("namespace", text, None),
            ("labels", Optional[Dict[str, str]], None),
            ("deletionTimestamp", text, None),  # a time; anything else: the general way
        ],
    )
    pod = struct(
        "Pod",
        [
            ("metadata", metadata),
            ("spec", Optional[spec], None),
            ("status", Optional[status], None),
            ("kind", Union[text, msgspec.UnsetType], msgspec.UNSET),  # the API's items carry none
        ],
    )
    list_metadata = struct(
        "ListMeta", [("continue_", text, msgspec.field(default=None, name="continue"))]
    )
    page = struct(
        "Page",
        [
            ("items", List[pod]),  # type: ignore[valid-type]
            ("kind", text, None),
            ("metadata", Optional[list_metadata], None),
        ],
    )
    return msgspec.json.Decoder(page)


@lru_cache(maxsize=None)
def resources_decoder(msgspec: Any) -> Any:
    """msgspec's decoder of a container's ``resources`` (or null): its ``limits`` and
    ``requests``, each an object or null, as :func:`.facts.read_pods` accepts them."""
    amounts = Optional[Dict[str, Any]]
    resources = msgspec.defstruct(
        "Resources", [("limits", amounts, None), ("requests", amounts, None)]
    )
    return msgspec.json.Decoder(Optional[resources])
