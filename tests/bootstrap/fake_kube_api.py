"""A thin fake of the Kubernetes API's LIST endpoints, on a real HTTPS server on loopback.

There is no Kubernetes API server here, so this serves what the bootstrap asks, written from the
documented API (Kubernetes API reference and "API Concepts"), and nothing more:

* ``GET /api/v1/nodes``, ``GET /api/v1/namespaces/<ns>/pods`` and
  ``GET /apis/topology.volcano.sh/v1alpha1/hypernodes`` (Volcano's CRD; 404 when it is not
  installed, as for a cluster without it) as typed lists (``NodeList``, ``PodList``,
  ``HyperNodeList``) whose items carry no ``kind``, as the API server answers;
* ``labelSelector`` with equality requirements (``a=b,c=d``), as for a job's pods;
* pagination: ``limit`` cuts a page and sets ``metadata.continue`` (an opaque token) while more
  remain, with ``metadata.remainingItemCount``; a ``continue`` token lists the rest of the same
  snapshot; a ``resourceVersion`` sent with a ``continue`` token is refused with 400, as the API
  server does ("specifying resource version is not allowed when using continue");
  ``cached_lists_whole=True``: a list asked with ``resourceVersion=0`` is answered whole,
  ``limit`` ignored, as API servers before Kubernetes 1.34 answer it from their watch cache
  ("limit is optional for the server to honor", kubernetes/kubernetes#96182; KEP-4988 made the
  cache page its answers);
* ``Authorization: Bearer <token>`` checked (401 with a ``Status`` object otherwise); resources
  named in ``forbidden`` answer 403 with a ``Status``, as RBAC does;
* ``Accept-Encoding: gzip`` honoured for answers of 128 KiB or more, as the API server compresses
  them (level 4);
* ``order``: the order items are listed in, per snapshot (``None``: as given; an int: a seeded
  shuffle, a new one for each snapshot) — the API promises no order.

Objects are plain dicts (fixtures, or built by the tests), each serialised once (a 4096-pod job
is 20 MB of JSON): to make the cluster move on between requests (pods getting scheduled), give
``pods``/``nodes``/``hypernodes`` new objects rather than editing them in place.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple
from urllib.parse import parse_qs, urlsplit

from .https_server import HTTPSServer, Response

NODES = "/api/v1/nodes"
HYPERNODES = "/apis/topology.volcano.sh/v1alpha1/hypernodes"
GZIP_FROM = 128 * 1024


def status(code: int, reason: str, message: str) -> Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return code, {"Content-Type": "application/json"}, json.dumps(body).encode()


class FakeKubernetesAPI:
    """The LIST endpoints of ``nodes``, ``pods`` (in ``namespaces``) and ``hypernodes`` on
    ``server`` (see the module docstring)."""

    def __init__(
        self,
        server: HTTPSServer,
        token: str,
        nodes: Sequence[Dict[str, Any]] = (),
        *,
        pods: Sequence[Dict[str, Any]] = (),
        hypernodes: Optional[Sequence[Dict[str, Any]]] = None,
        namespaces: Iterable[str] = ("default",),
        forbidden: Iterable[str] = (),
        order: Optional[int] = None,
        cached_lists_whole: bool = False,
    ) -> None:
        self.token = token
        self.cached_lists_whole = cached_lists_whole
        self.nodes = list(nodes)
        self.pods = list(pods)
        self.hypernodes = None if hypernodes is None else list(hypernodes)
        self.forbidden: Set[str] = set(forbidden)
        self.order = order
        self.lists: List[Tuple[str, Dict[str, List[str]]]] = []  # (path, query) of each LIST
        self._snapshots: Dict[int, List[bytes]] = {}
        self._lock = threading.Lock()
        self._serialised: Dict[int, Tuple[Any, bytes]] = {}
        server.routes[NODES] = lambda handler: self._list(handler, "nodes", "NodeList")
        server.routes[HYPERNODES] = lambda handler: self._list(
            handler, "hypernodes", "HyperNodeList"
        )
        for namespace in {*namespaces, *(p["metadata"].get("namespace", "default") for p in pods)}:
            server.routes[f"/api/v1/namespaces/{namespace}/pods"] = lambda handler, ns=namespace: (
                self._list(handler, "pods", "PodList", ns)
            )

    # --- one LIST request --------------------------------------------------------------------

    def _list(
        self,
        handler: BaseHTTPRequestHandler,
        resource: str,
        kind: str,
        namespace: Optional[str] = None,
    ) -> Response:
        if handler.headers.get("Authorization") != f"Bearer {self.token}":
            return status(401, "Unauthorized", "Unauthorized")
        if resource in self.forbidden:
            where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            return status(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "system:serviceaccount:'
                f'x:y" cannot list resource "{resource}"{where}',
            )
        if resource == "hypernodes" and self.hypernodes is None:
            return 404, {"Content-Type": "text/plain"}, b"404 page not found\n"
        url = urlsplit(handler.path)
        query = parse_qs(url.query)
        self.lists.append((url.path, query))
        token = query.get("continue", [None])[0]
        if token and query.get("resourceVersion"):
            return status(
                400, "BadRequest", "specifying resource version is not allowed when using continue"
            )
        limit = int(query.get("limit", ["0"])[0] or 0)
        if self.cached_lists_whole and query.get("resourceVersion") == ["0"]:
            limit = 0  # the watch cache answers whole
        if token:
            snapshot_id, offset = json.loads(base64.urlsafe_b64decode(token))
            items = self._snapshots[snapshot_id]
        else:
            items = self._snapshot(resource, namespace, query.get("labelSelector", [""])[0])
            with self._lock:
                snapshot_id = len(self._snapshots)
                self._snapshots[snapshot_id] = items
            offset = 0
        end = len(items) if not limit else min(len(items), offset + limit)
        metadata: Dict[str, Any] = {"resourceVersion": str(1000 + snapshot_id)}
        if end < len(items):
            metadata["continue"] = base64.urlsafe_b64encode(
                json.dumps([snapshot_id, end]).encode()
            ).decode()
            metadata["remainingItemCount"] = len(items) - end
        head = json.dumps({"kind": kind, "apiVersion": "v1", "metadata": metadata})[:-1].encode()
        body = head + b', "items": [' + b", ".join(items[offset:end]) + b"]}"
        headers = {"Content-Type": "application/json"}
        if len(body) >= GZIP_FROM and "gzip" in handler.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=4)
            headers["Content-Encoding"] = "gzip"
        return 200, headers, body

    def _snapshot(self, resource: str, namespace: Optional[str], selector: str) -> List[bytes]:
        objects = {"nodes": self.nodes, "pods": self.pods, "hypernodes": self.hypernodes or []}[
            resource
        ]
        wanted = [tuple(part.split("=", 1)) for part in selector.split(",") if part]
        chosen = [
            obj
            for obj in objects
            if (namespace is None or obj["metadata"].get("namespace", "default") == namespace)
            and all(obj["metadata"].get("labels", {}).get(key) == value for key, value in wanted)
        ]
        if self.order is not None:
            random.Random(self.order + len(self._snapshots)).shuffle(chosen)
        return [self._bytes(obj) for obj in chosen]

    def _bytes(self, obj: Dict[str, Any]) -> bytes:
        """An item as the API lists it (no kind, no apiVersion), serialised once per object."""
        cached = self._serialised.get(id(obj))
        if cached is None or cached[0] is not obj:
            listed = {key: value for key, value in obj.items() if key not in ("kind", "apiVersion")}
            cached = self._serialised[id(obj)] = (obj, json.dumps(listed).encode())
        return cached[1]


def service_account(directory, token: str, ca_file) -> Dict[str, str]:
    """A service account mounted at ``directory`` (token, ca.crt, namespace ``team-a``) and the
    environment a pod gets for it; ``KUBERNETES_SERVICE_*`` point at the server via ``in_cluster``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(ca_file.read_bytes())
    (directory / "namespace").write_text("team-a")
    return {"NPU_JOB_K8S_SA_DIR": str(directory)}


def in_cluster(server: HTTPSServer, account_env: Dict[str, str]) -> Dict[str, str]:
    return {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(server.port),
        **account_env,
    }
