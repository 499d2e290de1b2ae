"""Where the bootstrap's inputs come from (the I/O edge): files, HTTP(S) URLs, the Kubernetes API.

Everything returns raw bytes plus a name for messages; parsing is the readers' job. ``requests``
is imported only when a URL or the API is actually used (it costs ~100 ms of start-up, a large part
of the pod-side budget).

Rank table location (first that applies): ``--rank-table``, ``$RANK_TABLE_FILE`` (a file, a
directory holding ``jobstart_hccl.json`` or MindX's ``hccl.json``, or an ``http(s)://`` URL),
``/user/config/jobstart_hccl.json`` (CCE), ``/user/serverid/devindex/config/hccl.json`` (MindX).

Topology, first found wins (see :func:`topology_candidates`): ``--topology`` or
``$NPU_JOB_TOPOLOGY`` (path, URL, or ``k8s`` for the API), ``ranktable_tor.json`` beside a local
rank table, the MindCluster ``tor_info`` at ``$NPU_JOB_TOR_INFO``, the Kubernetes node labels when
running in a cluster with a service account (``$NPU_JOB_K8S_TOPOLOGY=0`` turns this off), and the
plain file ``/etc/npu-job/topology.yaml`` (or ``.json``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Tuple, Union

from npu_job.errors import InputError, shown
from npu_job.parsing import count_from_text
from npu_job.podfacts import (
    DEFAULT_RANK_TABLES,
    MINDX_RANK_TABLE_NAME,
    RANK_TABLE_NAME,
    RANKTABLE_TOR_NAME,
)

from .base.payload import (
    MAX_INPUT_BYTES,
    check_size,
    verbatim_or_shown,
)
from .options import SERVICE_ACCOUNT_DIR, SERVICE_ACCOUNT_ENV

log = logging.getLogger(__name__)

DEFAULT_PLAIN_TOPOLOGIES = ("/etc/npu-job/topology.yaml", "/etc/npu-job/topology.json")
K8S_TOPOLOGY = "k8s"  # the --topology / NPU_JOB_TOPOLOGY value that means "ask the API"

HTTP_CONNECT_TIMEOUT = 5.0
HTTP_READ_TIMEOUT = 30.0
HTTP_RETRIES = 3
HTTP_BACKOFF = 0.5  # seconds; doubles per retry (urllib3 Retry)
# Seconds a whole fetch may take, retries included, however slowly the server sends (the read
# timeout bounds one read only): a 64 MiB input at 1 MB/s, twice over.
HTTP_DEADLINE = 120.0

Verify = Union[bool, str]


class SourceUnavailable(InputError):
    """A source could not be read right now (connection refused, 5xx, timeout): may be transient."""


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


# --- reading bytes --------------------------------------------------------------------------------


def read_bytes(location: str, *, verify: Verify = True) -> bytes:
    """The bytes at a local path or an ``http(s)://`` URL, capped at 64 MiB."""
    if is_url(location):
        return fetch_url(location, verify=verify)
    return read_file(location)


def read_file(path: Union[str, os.PathLike]) -> bytes:
    name = os.fspath(path)
    try:
        with open(name, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            check_size(size, name)
            data = handle.read(MAX_INPUT_BYTES + 1)
    except FileNotFoundError:
        raise InputError(name, "file", "expected an existing file (not found)") from None
    except IsADirectoryError:
        raise InputError(name, "file", "expected a file, got a directory") from None
    except PermissionError:
        raise InputError(name, "file", "expected a readable file (permission denied)") from None
    check_size(len(data), name)  # /proc-like files report size 0
    return data


def http_session(retries: int = HTTP_RETRIES, backoff: float = HTTP_BACKOFF) -> Any:
    """A ``requests`` session retrying connection errors and 429/5xx with exponential backoff."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        other=0,  # e.g. a certificate error: retrying cannot fix it
        backoff_factor=backoff,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=frozenset({"GET"}),
        raise_on_status=False,
    )
    session = requests.Session()
    adapter = _bounded_adapter(HTTPAdapter)(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _bounded_adapter(base: Any) -> Any:
    """``requests``' adapter whose connections end every answer by the adapter's ``deadline``
    (:func:`~npu_job.bootstrap.base.deadline.bounded_connection`), proxied ones too."""
    from urllib3 import HTTPConnectionPool, HTTPSConnectionPool
    from urllib3.connection import HTTPConnection, HTTPSConnection

    from .base.deadline import bounded_connection

    plain, secure = bounded_connection(HTTPConnection), bounded_connection(HTTPSConnection)
    pools = {
        "http": type("BoundedPool", (HTTPConnectionPool,), {"ConnectionCls": plain}),
        "https": type("BoundedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": secure}),
    }

    class BoundedAdapter(base):  # type: ignore[misc, valid-type]
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
            manager = super().proxy_manager_for(*args, **kwargs)
            manager.pool_classes_by_scheme = pools
            return manager

        def set_deadline(self, deadline: float) -> None:
            plain.deadline = secure.deadline = deadline

    return BoundedAdapter


def fetch_url(
    url: str,
    *,
    verify: Verify = True,
    headers: Optional[Mapping[str, str]] = None,
    params: Optional[Mapping[str, str]] = None,
    session: Any = None,
    timeout: Tuple[float, float] = (HTTP_CONNECT_TIMEOUT, HTTP_READ_TIMEOUT),
    name: Optional[str] = None,
    deadline: float = HTTP_DEADLINE,
) -> bytes:
    """GET ``url`` (retries, timeouts, 64 MiB cap, the whole fetch within ``deadline`` seconds);
    4xx is an :class:`InputError`, network trouble, 5xx after retries and a deadline passed a
    :class:`SourceUnavailable`."""
    import time

    import requests

    from .base.deadline import DeadlinePassed

    label = name or url
    http = session or http_session()
    ends = time.monotonic() + deadline
    for adapter in http.adapters.values():
        if hasattr(adapter, "set_deadline"):
            adapter.set_deadline(ends)
    try:
        with http.get(
            url,
            headers=dict(headers or {}),
            params=params,
            verify=verify,
            timeout=timeout,
            stream=True,
        ) as response:
            reason = verbatim_or_shown(response.reason or "")
            got = f"expected 200 OK, got {response.status_code} {reason}"
            if response.status_code >= 500 or response.status_code == 429:
                raise SourceUnavailable(label, "HTTP status", got)
            if response.status_code != 200:
                raise InputError(label, "HTTP status", got)
            declared = count_from_text(response.headers.get("Content-Length") or "")
            if declared is not None:  # an early refusal; what arrives is counted below anyway
                check_size(declared, label)
            chunks: List[bytes] = []
            size = 0
            for chunk in response.iter_content(chunk_size=1 << 16):
                size += len(chunk)
                check_size(size, label)
                chunks.append(chunk)
            return b"".join(chunks)
    except requests.exceptions.SSLError as error:
        trusted = f"expected a certificate trusted by the CA bundle ({_first_line(error)})"
        raise InputError(label, "TLS", trusted) from None
    except DeadlinePassed:
        late = f"expected the whole answer within {deadline:g} s (the server sent it too slowly)"
        raise SourceUnavailable(label, "answer", late) from None
    except requests.exceptions.RequestException as error:
        reachable = f"expected a reachable server ({_first_line(error)})"
        raise SourceUnavailable(label, "connection", reachable) from None
    finally:
        if session is None:
            http.close()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return verbatim_or_shown(text[0]) if text else type(error).__name__


# --- the Kubernetes API ---------------------------------------------------------------------------


class KubernetesAPI(NamedTuple):
    """In-cluster API access: ``KUBERNETES_SERVICE_HOST/PORT`` + the service account token/CA
    (:mod:`npu_job.bootstrap.kube.api` asks it)."""

    base_url: str
    token_path: str
    ca_path: str

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], account_dir: str = SERVICE_ACCOUNT_DIR
    ) -> Optional[KubernetesAPI]:
        """The in-cluster API, or None when not in a cluster (no service host or no token); a
        ``KUBERNETES_SERVICE_PORT`` that is no port number is an :class:`InputError`."""
        host = env.get("KUBERNETES_SERVICE_HOST")
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        account = Path(env.get(SERVICE_ACCOUNT_ENV, account_dir))
        token = account / "token"
        if not host or not token.is_file():
            return None
        number = count_from_text(port.strip(), 5)
        if number is None or not 1 <= number <= 65535:
            raise InputError(
                "environment",
                "KUBERNETES_SERVICE_PORT",
                f"expected the API server's port, a number from 1 to 65535, got {shown(port)}",
            )
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6 literal
        return cls(f"https://{host}:{number}", str(token), str(account / "ca.crt"))

    @staticmethod
    def absent(
        env: Mapping[str, str], purpose: str, account_dir: str = SERVICE_ACCOUNT_DIR
    ) -> InputError:
        """Why :meth:`from_env` found no API (``purpose``: what it was wanted for): the service
        host unset, else the token file missing."""
        if not env.get("KUBERNETES_SERVICE_HOST"):
            return InputError(
                "Kubernetes API",
                "KUBERNETES_SERVICE_HOST",
                "expected in-cluster credentials (service host and a service account token)"
                + purpose,
            )
        token = Path(env.get(SERVICE_ACCOUNT_ENV, account_dir)) / "token"
        return InputError(
            str(token),
            "file",
            f"expected the service account token (not found){purpose}",
            tip="is automountServiceAccountToken off for the job's pods? NPU_JOB_K8S_SA_DIR "
            "names another directory",
        )


# --- locating inputs ------------------------------------------------------------------------------


def locate_rank_table(
    given: Optional[str], *, exists: Callable[[str], bool] = os.path.exists
) -> str:
    """The rank table's path or URL from ``given`` (``--rank-table``, else ``$RANK_TABLE_FILE``,
    as :func:`~.options.resolve` reads them), else the first default location that exists; an
    :class:`InputError` listing where we looked if none."""
    if given:
        if is_url(given):
            return given
        if os.path.isdir(given):
            inside = os.path.join(given, RANK_TABLE_NAME)
            mindx = os.path.join(given, MINDX_RANK_TABLE_NAME)  # a rings-config-<job> mount
            return mindx if not exists(inside) and exists(mindx) else inside
        return given
    for candidate in DEFAULT_RANK_TABLES:
        if exists(candidate):
            return candidate
    raise InputError(
        "rank table",
        "location",
        f"expected $RANK_TABLE_FILE or one of {', '.join(DEFAULT_RANK_TABLES)} "
        "(none is set or exists)",
        tip="is routing acceleration enabled for this job (the configmap1980 plugin)? A job "
        "without a rank table routes by its pods: NPU_JOB_PODS=k8s",
    )


def ranktable_tor_beside(rank_table: str) -> Optional[str]:
    """Where CCE puts the switch topology of a local rank table: ``ranktable_tor.json`` beside it
    (None for a URL)."""
    if is_url(rank_table):
        return None
    return os.path.join(os.path.dirname(rank_table) or ".", RANKTABLE_TOR_NAME)


class TopologyCandidate(NamedTuple):
    """One place a topology may be: ``location`` is a path, URL, or :data:`K8S_TOPOLOGY`."""

    location: str
    fmt: Optional[str] = None  # None: detect by content
    required: bool = False  # named explicitly by the user: a failure is an error, not a skip


def topology_candidates(
    explicit: Optional[str],
    fmt: Optional[str],
    rank_table: str,
    *,
    tor_info: Optional[str] = None,
    ask_api: bool = True,
) -> List[TopologyCandidate]:
    """Where to look for the switch topology, in order; the first that exists wins."""
    if explicit:  # a file, a URL, or the cluster's HyperNodes, else its node labels
        return [TopologyCandidate(explicit, fmt, required=True)]
    candidates = []
    beside = ranktable_tor_beside(rank_table)
    if beside is not None:
        candidates.append(TopologyCandidate(beside, fmt or "cce-ranktable-tor"))
    if tor_info:
        candidates.append(TopologyCandidate(tor_info, fmt or "basic-tor-node-cm"))
    if ask_api:
        candidates.append(TopologyCandidate(K8S_TOPOLOGY, fmt))
    candidates.extend(TopologyCandidate(path, fmt or "file") for path in DEFAULT_PLAIN_TOPOLOGIES)
    return candidates
