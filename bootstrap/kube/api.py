"""The in-cluster Kubernetes API (the I/O edge): LIST pods, Nodes and HyperNodes, page by page.

Credentials are the pod's service account (:class:`~npu_job.bootstrap.sources.KubernetesAPI`:
``KUBERNETES_SERVICE_HOST/PORT``, the token and ``ca.crt``). Each LIST asks for pages of
:data:`PAGE_SIZE` items (``limit``) and follows ``metadata.continue`` until the last page, as the
API reference describes ("Retrieving large results sets in chunks"); the first page is asked with
``resourceVersion=0`` so that the API server may answer from its watch cache (every pod of a big
job asks at once), the next ones with ``continue`` alone (the API refuses a resource version with
a continue token). Before Kubernetes 1.34 the watch cache ignores ``limit``: the first answer
then holds the whole list (a 4096-pod job's ~20 MB, read by :mod:`.podpage` in one pass). An
expired token (``410 Gone``) counts as a passing failure: the next poll starts over.

Standard library only (``http.client`` and ``ssl``): importing ``requests`` costs about 0.1 s of
CPU, as much as a 4096-pod job's whole plan once the API answers. One keep-alive HTTPS
connection serves every page; responses may come gzipped (``Accept-Encoding: gzip``; the API
server compresses big ones) and are capped at :data:`~..base.payload.MAX_INPUT_BYTES`
per page. Connection errors, 429 and 5xx are retried with exponential backoff; a 4xx or a
certificate error is an :class:`InputError` at once (401: the token, 403: the RBAC rule the job
needs).

Every list is bounded, whatever the server answers: a read waits at most :data:`TIMEOUT`, an
answer (connecting, headers, body) ends within :data:`ANSWER_DEADLINE` however slowly it comes
(:mod:`..base.deadline`), a list of every page and retry within :data:`LIST_DEADLINE`, in at most
:data:`MAX_PAGES` pages and :data:`MAX_ITEMS` items; a continue token that comes back (a server
paging in a cycle) is an error at once. Each names the list's URL (the token goes in a header,
never in the URL).
"""

from __future__ import annotations

import logging
import time
from itertools import islice
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple
from urllib.parse import quote, urlencode, urlsplit

from npu_job.kinds.base import JobKind

from npu_job.errors import InputError, shown
from npu_job.parsing import count_from_text
from npu_job.polling import Backoff

from ..base.payload import (
    MAX_INPUT_BYTES,
    check_size,
    decode_document,
    json_text,
    verbatim_or_shown,
)
from ..canonical import sha256
from ..sources import SERVICE_ACCOUNT_DIR, KubernetesAPI, SourceUnavailable
from .facts import PodFacts, read_pods
from .objects import KubeObjects, list_continue, read_objects
from .podpage import read_pod_page

log = logging.getLogger(__name__)

PAGE_SIZE = 500
RETRIES = 3  # after the first attempt; a quick client (an optional source) retries once
RETRY = Backoff(0.5, factor=2.0, cap=2.0)  # 0.5, 1, 2 s between attempts, no jitter
TIMEOUT = 30.0  # seconds one read may wait (a silent server)
QUICK_TIMEOUT = 5.0  # an optional source (the topology in the automatic chain)
# Seconds one answer may take from connecting to its last byte (a server may send a byte every
# few seconds and never trip TIMEOUT). Every pod of a 4096-pod job asks for its ~20 MB of pods at
# once, 80 GB through the API server: about a minute at 10 Gb/s; twice that.
ANSWER_DEADLINE = 120.0
QUICK_ANSWER_DEADLINE = 30.0
# Seconds a whole list (every page and retry) may take: the default wait for the pods, which the
# pod's poll then does not overrun by more than one list.
LIST_DEADLINE = 300.0
QUICK_LIST_DEADLINE = 60.0
# Items a list may hold: Kubernetes supports clusters of 150,000 pods (its scalability
# thresholds) and EKS and GKE clusters of up to 100,000 nodes; a job's pods are far fewer. A page
# may hold more than PAGE_SIZE (a server that ignores limit): the count bounds what is kept.
MAX_ITEMS = 200_000
# Pages a list may take: MAX_ITEMS in pages of PAGE_SIZE (an API server fills every page but the
# last), so a server paging on without end with few or no items stops here.
MAX_PAGES = 400
# Characters of a continue token: the API server's encodes a resource version and a key (well
# under 1 KiB); the token goes back in the next request's URL.
MAX_CONTINUE_CHARS = 16 * 1024
NODES_PATH = "/api/v1/nodes"
HYPERNODES_PATH = "/apis/topology.volcano.sh/v1alpha1/hypernodes"
NAMESPACE_ENV = "NPU_JOB_NAMESPACE"


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"


def namespace_of(env: Mapping[str, str], account_dir: str = SERVICE_ACCOUNT_DIR) -> Optional[str]:
    """This pod's namespace: ``$NPU_JOB_NAMESPACE``, else the service account's ``namespace``
    file (mounted beside the token); None when neither says."""
    given = env.get(NAMESPACE_ENV, "").strip()
    if given:
        return given
    path = f"{env.get('NPU_JOB_K8S_SA_DIR', account_dir)}/namespace"
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


class KubeClient:
    """LIST calls on one HTTPS connection: ``with KubeClient(api) as client: client.list(...)``."""

    def __init__(
        self,
        api: KubernetesAPI,
        *,
        quick: bool = False,
        page_size: Optional[int] = None,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.api = api
        self._sleep = sleep
        self.page_size = page_size or PAGE_SIZE
        self.retries = 1 if quick else RETRIES
        self.timeout = QUICK_TIMEOUT if quick else TIMEOUT
        self.answer_deadline = QUICK_ANSWER_DEADLINE if quick else ANSWER_DEADLINE
        self.list_deadline = QUICK_LIST_DEADLINE if quick else LIST_DEADLINE
        self._list_ends = float("inf")  # the monotonic time the list being read must end by
        parts = urlsplit(api.base_url)
        self._host = parts.hostname or ""
        self._port = parts.port or 443
        self._connection: Any = None
        self._context: Any = None

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def list(self, path: str, params: Optional[Mapping[str, str]] = None) -> KubeObjects:
        """Every item of ``GET path`` (all pages), sorted by kind; ``params`` such as
        ``labelSelector`` go with every page."""
        objects = KubeObjects()
        for document, name in self._pages(path, params):
            objects += read_objects(document, name)
        log.debug(
            "%s%s: %d item(s)",
            self.api.base_url,
            path,
            len(objects.nodes) + len(objects.pods) + len(objects.hypernodes),
        )
        return objects

    def list_pods(
        self, path: str, params: Optional[Mapping[str, str]] = None
    ) -> Tuple[PodFacts, ...]:
        """:func:`~npu_job.bootstrap.kube.facts.read_pods` of every Pod of ``GET path`` (all
        pages): each page read straight into the facts (:func:`read_pod_page`), else the general
        way, which reads the same facts or names what is wrong."""
        pods: List[PodFacts] = []
        for document, name in self._pages(path, params, read_pod_page):
            if type(document) is tuple:
                pods.extend(document)
            else:
                pods.extend(read_pods(read_objects(document, name).pods, name))
        log.debug("%s%s: %d pod(s)", self.api.base_url, path, len(pods))
        return tuple(pods)

    def _pages(
        self,
        path: str,
        params: Optional[Mapping[str, str]],
        typed: Optional[Callable[[bytes], Optional[Tuple[Any, Optional[str]]]]] = None,
    ) -> Iterator[Tuple[Any, str]]:
        """``(page, name)`` of each page of ``GET path``: what ``typed`` read from the page's
        JSON text, else the decoded document (``typed`` declined, or none given)."""
        name = f"{self.api.base_url}{path}"
        query: Dict[str, str] = {
            **(params or {}),
            "limit": str(self.page_size),
            "resourceVersion": "0",
        }
        self._list_ends = time.monotonic() + self.list_deadline
        seen: Set[bytes] = set()  # digests of the continue tokens given so far
        pages = items = 0
        try:
            while True:
                text = json_text(self.get(path, query), name, verify_crc=False)  # TLS did
                pages += 1
                read = typed(text) if typed is not None else None
                if read is not None:
                    page, token = read
                else:
                    page = decode_document(text, name)
                    token = list_continue(page)
                items += _item_count(page)
                if items > MAX_ITEMS:
                    raise InputError(
                        name,
                        "items",
                        f"expected at most {MAX_ITEMS} items in the list (page {pages})",
                    )
                yield page, name
                if token is None:
                    return
                _check_continue(token, pages, seen, self.page_size, name)
                query = {**(params or {}), "limit": str(self.page_size), "continue": token}
        finally:
            self._list_ends = float("inf")

    def get(self, path: str, query: Mapping[str, str]) -> bytes:
        """The body of ``GET path?query`` (200 only), retried as the module docstring says."""
        import http.client
        import ssl

        target = f"{path}?{urlencode(query)}" if query else path
        name = f"{self.api.base_url}{path}"
        pauses = islice(RETRY.pauses(), self.retries)
        while True:
            reused = self._connection is not None
            try:
                status, reason, headers, body = self._request(target, name)
            except ssl.SSLCertVerificationError as error:
                raise InputError(
                    name,
                    "TLS",
                    "expected a certificate trusted by the service "
                    f"account's CA ({_first_line(error)})",
                ) from None
            except (OSError, http.client.HTTPException) as error:
                self.close()
                if reused:  # the server closed a kept-alive connection: a fresh one, at once
                    continue
                problem = SourceUnavailable(
                    name, "connection", f"expected a reachable API server ({_first_line(error)})"
                )
            else:
                if status == 200:
                    return body
                problem = _status_error(name, status, reason, body)
                if not isinstance(problem, SourceUnavailable):
                    raise problem
            pause = next(pauses, None)
            if pause is None:
                raise problem
            if time.monotonic() + pause >= self._list_ends:
                raise self._list_late(name, problem)
            self._sleep(pause)

    def _list_late(self, name: str, problem: Optional[InputError] = None) -> SourceUnavailable:
        last = f"; last: {problem.field}: {problem.expected}" if problem is not None else ""
        return SourceUnavailable(
            name, "list", f"expected the whole list within {self.list_deadline:g} s{last}"
        )

    def _request(self, target: str, name: str) -> Tuple[int, str, Any, bytes]:
        from ..base.deadline import DeadlinePassed

        now = time.monotonic()
        if now >= self._list_ends:
            raise self._list_late(name)
        if self._connection is None:
            self._connection = _connection_class()(
                self._host, self._port, timeout=self.timeout, context=self._tls()
            )
        self._connection.deadline = min(now + self.answer_deadline, self._list_ends)
        try:
            return self._exchange(target, name)
        except DeadlinePassed:
            self.close()
            if now + self.answer_deadline >= self._list_ends:
                raise self._list_late(name) from None
            raise SourceUnavailable(
                name,
                "answer",
                f"expected a whole answer within {self.answer_deadline:g} s (the server sent it "
                "too slowly)",
            ) from None

    def _exchange(self, target: str, name: str) -> Tuple[int, str, Any, bytes]:
        token = _read_token(self.api.token_path)
        self._connection.request(
            "GET",
            target,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "Accept-Encoding": "gzip",
                "User-Agent": "npu-job-bootstrap",
            },
        )
        response = self._connection.getresponse()
        try:
            declared = count_from_text(response.getheader("Content-Length") or "")
            if declared is not None:
                check_size(declared, name)
            body = response.read(MAX_INPUT_BYTES + 1)
            check_size(len(body), name)
        except InputError:  # over the cap: the rest of the answer is never read
            self.close()
            raise
        return response.status, response.reason, response.headers, body

    def _tls(self) -> Any:
        if self._context is None:
            import os
            import ssl

            ca = self.api.ca_path if os.path.isfile(self.api.ca_path) else None
            self._context = ssl.create_default_context(cafile=ca)
        return self._context


def _connection_class() -> Any:
    """``http.client.HTTPSConnection`` with answers bounded in time (:mod:`..base.deadline`)."""
    if not _CONNECTION:
        import http.client

        from ..base.deadline import bounded_connection

        _CONNECTION.append(bounded_connection(http.client.HTTPSConnection))
    return _CONNECTION[0]


_CONNECTION: List[Any] = []


def _item_count(page: Any) -> int:
    """Items of a page: the facts :func:`read_pod_page` read, or a document's ``items``."""
    if type(page) is tuple:
        return len(page)
    listed = page.get("items") if type(page) is dict else None
    return len(listed) if type(listed) is list else 0


def _check_continue(token: str, pages: int, seen: Set[bytes], page_size: int, name: str) -> None:
    """Refuse a continue token that would page on without end: too long to send back, given
    before in this list (a cycle), or past :data:`MAX_PAGES`; else remember it in ``seen``."""
    field = "metadata.continue"
    if len(token) > MAX_CONTINUE_CHARS:
        raise InputError(
            name,
            field,
            f"expected a continue token of at most {MAX_CONTINUE_CHARS} characters, got "
            f"{len(token)} (page {pages})",
        )
    digest = sha256(token.encode("utf-8", "surrogatepass")).digest()
    if digest in seen:
        raise InputError(
            name,
            field,
            f"expected a new continue token on every page; page {pages} gave {shown(token)} "
            "again (the server pages in a cycle)",
        )
    if pages >= MAX_PAGES:
        raise InputError(
            name, field, f"expected the list to end within {MAX_PAGES} pages of {page_size}"
        )
    seen.add(digest)


def _read_token(path: str) -> str:
    """The service account token: one line of printable ASCII (a JWT), as an HTTP header carries
    it. Anything else is an error that never shows the token (it is a credential and the error
    goes to the pod's log and route_plan.json): only its length and a short digest."""
    from ..sources import read_file

    raw = read_file(path)
    token = raw.strip()
    if token and token.isascii() and all(0x21 <= byte <= 0x7E for byte in token):
        return token.decode("ascii")
    if not token:
        found = "an empty file"
    else:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            kind = "bytes that are not UTF-8"
        else:
            if "\n" in text or "\r" in text:
                kind = "a line break inside"
            elif not text.isascii():
                kind = "characters that are not ASCII"
            else:
                kind = "a space or control character inside"
        digest = sha256(raw).hexdigest()[:TOKEN_DIGEST_CHARS]
        found = f"{len(raw)} bytes with {kind} (sha256 {digest}...; the token is not shown)"
    raise InputError(path, "token", f"expected a service account token on one line; got {found}")


# Hex digits of a token's sha256 an error shows: enough to tell two tokens apart, never the token.
TOKEN_DIGEST_CHARS = 12


def _status_error(name: str, status: int, reason: str, body: bytes) -> InputError:
    """The error of a non-200 answer; the API's ``Status.message`` says what it refused."""
    message = ""
    try:
        document = decode_document(body, name)
        if type(document) is dict and type(document.get("message")) is str:
            message = f": {verbatim_or_shown(document['message'])}"
    except InputError:
        pass
    got = f"expected 200 OK, got {status} {verbatim_or_shown(reason or '')}{message}"
    if status in (429, 410) or status >= 500:  # busy, an expired continue token, or a fault
        return SourceUnavailable(name, "HTTP status", got)
    tip = None
    if status == 401:
        tip = "the service account token was refused: is it mounted and current?"
    elif status == 403:
        tip = (
            "the job's service account needs list permission here (npu-job render emits the "
            "Role and ClusterRole when routing uses the API)"
        )
    error = InputError(name, "HTTP status", got, tip=tip)
    error.status = status  # type: ignore[attr-defined]  # 404: a resource this cluster lacks
    return error


def status_of(error: InputError) -> Optional[int]:
    """The HTTP status of an error from :meth:`KubeClient.get`, when it was an HTTP answer."""
    return getattr(error, "status", None)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return verbatim_or_shown(text[0]) if text else type(error).__name__


def job_selector_query(kind: JobKind, job: str, group: Optional[str]) -> Dict[str, str]:
    """The ``labelSelector`` of a job's pods (of one group, a Volcano Job's task, when given), as
    its kind labels them."""
    return {"labelSelector": kind.selector(job, group or "")}


def topology_objects(client: KubeClient, *, by_name: bool = False) -> KubeObjects:
    """The cluster's HyperNodes and Nodes, for a topology: a cluster without the HyperNode CRD
    (404) or a service account not allowed to list them (403) has none; likewise Nodes (then
    HyperNodes are matched by node name alone). Anything else raises.

    ``by_name``: the servers are known by node name (a job's pods), so the Nodes are listed only
    when their labels are needed: no HyperNodes, or HyperNodes that select nodes by label.
    """
    from .hypernode import selects_by_label

    found = KubeObjects()
    for path in (HYPERNODES_PATH, NODES_PATH):
        if (
            path == NODES_PATH
            and by_name
            and found.hypernodes
            and not selects_by_label(found.hypernodes)
        ):
            log.debug("topology: the HyperNodes name their nodes; the Nodes are not listed")
            break
        try:
            found += client.list(path)
        except InputError as error:
            if status_of(error) not in (403, 404):
                raise
            log.info("topology: %s", error.message)
    return found
