"""The fixture cluster (tests/bootstrap/fixtures/kube/cluster.json), its first Node and Pod, and
the damaged copies of them that hold the Kubernetes readers to one meaning.

A fast reader must read what the field-by-field reader reads, or raise the same message, on every
damaged copy hypothesis makes: :func:`paths_into` lists every place in a document,
:func:`damaged_copy` puts one of :data:`VALUES` there, :func:`outcome_of` is what a reader made of
the result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator, Tuple

from hypothesis import strategies as st

from npu_job.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures" / "kube"
CLUSTER = json.loads((FIXTURES / "cluster.json").read_text())
NODE = next(i for i in CLUSTER["items"] if i["kind"] == "Node")
POD = next(i for i in CLUSTER["items"] if i["kind"] == "Pod")
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 12),
    st.text(max_size=4),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def paths_into(value: Any, prefix: Tuple[Any, ...] = ()) -> Iterator[Tuple[Any, ...]]:
    """Every path into a document, containers and leaves."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths_into(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths_into(item, prefix + (index,))


def damaged_copy(document: Any, path: Tuple[Any, ...], value: Any) -> Any:
    """A deep copy of ``document`` with ``value`` at ``path`` (the value itself at ``()``)."""
    copy = json.loads(json.dumps(document))
    if not path:
        return value
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


def outcome_of(read: Callable[[Any], Any], obj: Any) -> Tuple[str, Any]:
    """``("ok", what read returned)`` or ``("error", the InputError's message)``."""
    try:
        return "ok", read(obj)
    except InputError as error:
        return "error", error.message
