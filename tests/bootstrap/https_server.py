"""A real HTTPS server on loopback for the URL and Kubernetes API sources.

The certificate is self-signed and generated per test session with the ``cryptography`` package
(subjectAltName ``IP:127.0.0.1``), so ``requests`` verifies it for real against the CA file we hand
it; nothing is mocked below the socket. Routes are plain callables ``(handler) -> (status, headers,
body)`` so each test states exactly what the server says (``None``: it hangs up without an
answer).

The Kubernetes API is faked on top of it in :mod:`tests.bootstrap.fake_kube_api`.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

Response = Tuple[int, Dict[str, str], bytes]
Route = Callable[[BaseHTTPRequestHandler], Response]


def make_self_signed(directory: Path) -> Tuple[Path, Path]:
    """(cert.pem, key.pem) for 127.0.0.1, valid for a day; the cert is its own CA.

    Uses the ``cryptography`` package when installed, else the ``openssl`` command.
    """
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _make_self_signed_with_openssl(directory)
    return _make_self_signed_with_cryptography(directory)


def _make_self_signed_with_openssl(directory: Path) -> Tuple[Path, Path]:
    import shutil
    import subprocess

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("needs the cryptography package or the openssl command to make a certificate")
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=npu-job test server",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-keyout",
            str(key_path),
            "-out",
            str(cert_path),
        ],
        check=True,
        capture_output=True,
    )
    return cert_path, key_path


def _make_self_signed_with_cryptography(directory: Path) -> Tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "npu-job test server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class HTTPSServer:
    """``with HTTPSServer(cert, key) as server: server.routes["/x"] = ...; server.url("/x")``.

    ``keep_alive``: answer in HTTP/1.1, keeping each connection open for the next request (as the
    Kubernetes API server does); HTTP/1.0 otherwise, one request per connection.
    """

    def __init__(self, cert: Path, key: Path, *, keep_alive: bool = False) -> None:
        self.routes: Dict[str, Route] = {}
        self.requests: List[Tuple[str, Dict[str, str]]] = []
        self.busy: List[Tuple[float, float]] = []  # perf_counter span of each request, answer sent
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
            # TCP_NODELAY, as the Kubernetes API server (Go's net package sets it on every TCP
            # connection). With Nagle's algorithm on, the tail of each TLS record of a big answer
            # waits for the client's delayed ACK: 40 ms stalls, ten in a 4096-pod listing.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                started = time.perf_counter()
                try:
                    self._answer()
                finally:
                    outer.busy.append((started, time.perf_counter()))

            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                outer.requests.append((self.path, dict(self.headers.items())))
                route = outer.routes.get(path)
                answer = route(self) if route else (404, {}, b"not found")
                if answer is None:  # hang up without an answer, as a server closing an idle
                    self.close_connection = True  # kept-alive connection does
                    return
                status, headers, body = answer
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:  # a route may declare another length
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> HTTPSServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_bytes(body: bytes, status: int = 200) -> Route:
    return lambda handler: (status, {"Content-Type": "application/json"}, body)


def serve_sequence(*responses: Response) -> Route:
    """Answer with each response in turn, then keep repeating the last one."""
    queue = list(responses)

    def route(handler: BaseHTTPRequestHandler) -> Response:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return route


def serve_dripping(body: bytes, every: float, *, head_too: bool = True) -> Route:
    """Answer 200 with ``body`` a byte every ``every`` seconds (its head too, with ``head_too``),
    as a slow or hostile server may: each byte resets a reader's per-read timeout. It stops when
    the client hangs up."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        head += b"Content-Length: %d\r\n\r\n" % len(body)
        slow = head + body if head_too else body
        try:
            if not head_too:
                handler.wfile.write(head)
            for position in range(len(slow)):
                handler.wfile.write(slow[position : position + 1])
                time.sleep(every)
        except OSError:  # the client gave up
            pass
        return None  # hang up: the answer is sent

    return route  # type: ignore[return-value]


def tls_files_fixture(tmp_path_factory: Any) -> Tuple[Path, Path]:
    """Body of a module-scoped fixture: one self-signed certificate per test module."""
    return make_self_signed(tmp_path_factory.mktemp("tls"))
