"""What ``kubectl apply`` (client-side) adds to a rendered object, and render's warning near the limit.

kubectl keeps the object it applied, as JSON, in the ``last-applied-configuration`` annotation,
and the API server refuses an object whose annotations total more than 262,144 bytes
(``TotalAnnotationSizeLimitB``). The size is computed here from kubectl's algorithm
(``GetModifiedConfiguration``: the object with that annotation emptied out, encoded by Go's
``encoding/json``); where kubectl is installed, its own client-side apply (``--dry-run=client``)
is run against a thin fake of the API server, from the documented discovery format (APIVersions,
APIGroupList, APIResourceList, a 404 Status for the object: no cluster has one to give), and must
give the same annotation byte for byte. The size test of the examples is in tests/test_bundle.py.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
import yaml
from npu_job.render.render import (
    ANNOTATIONS_LIMIT,
    APPLY_WARN_SHARE,
    LAST_APPLIED_ANNOTATION,
    annotations_after_apply,
    apply_size_warning,
    last_applied_configuration,
    render,
)

from npu_job.bundle import Bundle

from .conftest import MINIMAL, spec_from

ROOT = Path(__file__).resolve().parents[2]

_DISCOVERY: Dict[str, Any] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "configmaps",
                "singularName": "configmap",
                "namespaced": True,
                "kind": "ConfigMap",
                "verbs": ["create", "delete", "get", "list", "patch", "update"],
            }
        ],
    },
}
_NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound"}


class _FakeApiServer(BaseHTTPRequestHandler):
    """Discovery, and no object: what kubectl apply asks before it creates one."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = _DISCOVERY.get(self.path.split("?")[0])
        data = json.dumps(body or {**_NOT_FOUND, "code": 404}).encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_api_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _kubectl_last_applied(server: str, document: Dict[str, Any], tmp_path: Path) -> str:
    manifest = tmp_path / "object.yaml"
    manifest.write_text(yaml.safe_dump(document, allow_unicode=True))
    done = subprocess.run(
        ["kubectl", f"--server={server}", "apply", "--dry-run=client", "--validate=false"]
        + ["-o", "json", "-f", str(manifest)],
        env={
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "KUBECONFIG": "/dev/null",
            "HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]


def _configmap(spec_values: Dict[str, Any]) -> Dict[str, Any]:
    return next(yaml.safe_load_all(render(spec_from(spec_values)).stream()))


TRICKY = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "tricky",
        "namespace": "default",
        "annotations": {"team": "a<b>&c", LAST_APPLIED_ANNOTATION: "an old one"},
    },
    "data": {"train.sh": "echo é 中 \u2028 \u2029 <&> 'q' \"dq\" \\ \t $x\n", "count": "1"},
}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_the_annotation_is_the_one_kubectls_own_client_side_apply_writes(
    fake_api_server: str, tmp_path: Path
) -> None:
    for document in (_configmap(MINIMAL), TRICKY):
        expected = _kubectl_last_applied(fake_api_server, document, tmp_path)
        assert last_applied_configuration(document) == expected
    assert annotations_after_apply(TRICKY) == sum(
        len(key.encode()) + len(value.encode())
        for key, value in {
            "team": "a<b>&c",
            LAST_APPLIED_ANNOTATION: last_applied_configuration(TRICKY),
        }.items()
    )


def test_render_warns_near_the_limit_and_names_the_ways_without_it(caplog) -> None:
    quiet = render(spec_from(MINIMAL))
    assert not [warning for warning in quiet.warnings if LAST_APPLIED_ANNOTATION in warning]
    # a bundle whose base64 takes the ConfigMap just past the share render warns at
    big = int(ANNOTATIONS_LIMIT * APPLY_WARN_SHARE * 3 / 4) + 1024
    stand_in = Bundle(b"\x00" * big, "sha256:" + "0" * 64, "0.0.0", 0, 0)
    with caplog.at_level(logging.WARNING, logger="npu_job.render.render"):
        rendered = render(spec_from(MINIMAL), bundle=stand_in)
    configmap = next(yaml.safe_load_all(rendered.stream()))
    size = annotations_after_apply(configmap)
    assert ANNOTATIONS_LIMIT * APPLY_WARN_SHARE < size < ANNOTATIONS_LIMIT
    warning = apply_size_warning(configmap)
    assert warning is not None and warning in rendered.warnings
    assert [record.getMessage() for record in caplog.records] == [warning]
    assert warning.startswith(
        f"ConfigMap demo-scripts: kubectl apply (client-side) would give it {size} bytes"
    )
    assert f"{size / ANNOTATIONS_LIMIT:.0%} of the {ANNOTATIONS_LIMIT}" in warning
    assert "kubectl apply --server-side (or kubectl create)" in warning


def test_past_the_limit_the_warning_says_past() -> None:
    document = {**TRICKY, "data": {"big": "x" * ANNOTATIONS_LIMIT}}
    warning = apply_size_warning(document)
    assert warning is not None and f"past the {ANNOTATIONS_LIMIT}" in warning
