"""A page of the API's ``PodList`` read straight into :class:`~.facts.PodFacts` (pure).

The fast path of the pods of a big job (a pod of a 4096-pod job lists ~5 KB, of which the fields
read are 300 bytes): msgspec decodes the page into typed structs of just the fields
:func:`~npu_job.bootstrap.kube.facts.read_pods` reads, which checks their types as it goes, and the
facts are taken from them with no field-by-field checks. Anything else (msgspec not loaded, a
page of another shape, a pod that does not fit the types) is left, having decided nothing, to the
general readers (:mod:`npu_job.bootstrap.kube.objects`, :mod:`npu_job.bootstrap.kube.facts`), which
read the same facts or name what is wrong.

Why it stays with msgspec optional: msgspec's plain decode into builtins, then
the general readers, takes twice the instructions at 4096 pods (callgrind, side by side:
1,791 M against 897 M for the whole bootstrap), which would give up most of what msgspec buys on
the API path. The standard library's path never enters it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..base.jsondecode import decode_typed
from .facts import PodFacts, devices_of
from .podtypes import POD_PAGE_BUILDS_AT_MOST, pod_page_decoder, resources_decoder


def read_pod_page(text: bytes) -> Optional[Tuple[Tuple[PodFacts, ...], Optional[str]]]:
    """``(the pods' facts, the continue token)`` of one page of the API's ``PodList`` (JSON text),
    decoded by msgspec into the fields :func:`~.facts.read_pods` reads, typed, so that
    checking them costs next to nothing; None, having decided nothing, unless msgspec is loaded
    and the page is a ``PodList`` of well-formed pods without a ``kind`` (as the API answers): the
    caller then reads it the general way (:func:`~..base.payload.decode_document`,
    :func:`~.objects.read_objects`, :func:`~.facts.read_pods`), which reads the same facts
    or names what is wrong.
    """
    page = decode_typed(text, pod_page_decoder, builds_at_most=POD_PAGE_BUILDS_AT_MOST)
    if page is None or page.kind != "PodList":
        return None
    absent = _unset()
    facts: List[PodFacts] = []
    append = facts.append
    new_facts = tuple.__new__  # a NamedTuple from all its fields, without a Python frame each
    # The pods of a job ask for the same resources: count each distinct text once.
    counted: Dict[Tuple[bytes, ...], Optional[int]] = {}
    for index, pod in enumerate(page.items):
        metadata, spec, status = pod.metadata, pod.spec, pod.status
        if pod.kind is not absent or not metadata.name:
            return None
        accelerators: Optional[int] = 0
        if spec is not None and spec.containers:
            texts = tuple([bytes(container.resources) for container in spec.containers])
            accelerators = counted.get(texts, _UNCOUNTED)
            if accelerators is _UNCOUNTED:
                accelerators = counted[texts] = _accelerators(texts)
        if accelerators is None:
            return None
        append(
            new_facts(  # PodFacts(...) with every field given: its __new__ only binds them
                PodFacts,
                (
                    metadata.name,
                    metadata.namespace or "",
                    {} if metadata.labels is None else metadata.labels,
                    spec is not None and spec.nodeName or "",
                    status is not None and status.hostIP or "",
                    status is not None and status.phase or "",
                    metadata.deletionTimestamp is not None,
                    accelerators,
                    f"items[{index}]",
                    status is not None and status.podIP or "",
                ),
            )
        )
    token = page.metadata.continue_ if page.metadata is not None else None
    return tuple(facts), token or None


_UNCOUNTED: Any = object()


def _accelerators(resources: Tuple[bytes, ...]) -> Optional[int]:
    """:func:`.facts.devices_of` of the containers' ``resources`` (JSON text each, empty when
    absent); None: resources that do not fit the types :func:`.facts.read_pods` accepts."""
    import msgspec  # loaded: read_pod_page decoded a page with it

    decode = resources_decoder(msgspec).decode
    try:
        typed = [decode(text) for text in resources if text]
    except (ValueError, msgspec.MsgspecError):
        return None
    return devices_of((each.limits, each.requests) for each in typed if each is not None)


def _unset() -> Any:
    import msgspec  # loaded: read_pod_page decoded a page with it

    return msgspec.UNSET
