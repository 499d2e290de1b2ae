"""The least a pod can do to read its job's pods from the API: the floor of ``bench_bootstrap_api``.

Run by ``bench_bootstrap_api.py`` beside the bootstrap, with the same environment (the in-cluster
API, the service account, ``MA_VJ_NAME``). It does what no reader of the API's pods can skip and
nothing else: load the standard library's ``ssl`` and ``http.client`` and msgspec, open one TLS
connection trusting the service account's CA, list the job's pods in the bootstrap's pages
(``limit``, ``continue``, ``resourceVersion=0``, gzip as the API server sends big answers),
inflate each page as the bootstrap does (without the CRC-32; by zlib-ng, loaded by the first
big page, when installed: the bootstrap's own choice, ``npu_job.bootstrap.accelerator.ZLIB_NG``)
and decode it by msgspec into typed structs of the nine fields the bootstrap reads (the
bootstrap's own decoder, from :mod:`npu_job.bootstrap.podtypes`; neither module loads anything
else of npu_job). No checks, no roster, no topology, no plan, no files; and it exits as the
bootstrap does, without freeing what it read object by object.

Its CPU over a bare interpreter is what reading the pods costs before any planning: what the
bootstrap's budget has to hold besides the plan. It exits 0 having read every pod of the job.

With ``NPU_JOB_BENCH_PHASES=1`` (``bench_bootstrap_api.py --callgrind``, under ``valgrind
--tool=callgrind --dump-before=zlib_adler32``) it calls ``zlib.adler32`` at every boundary between
its phases (start-up and imports, with the decoder's making; TLS and HTTP; inflating; decoding),
so that callgrind writes the instructions of each to a profile of its own, and prints the phases'
names, one per boundary, as ``_bootstrap_phases.py`` does (both through ``_phase_marks.py``).
Inflating a raw deflate stream never calls ``adler32`` itself.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any, List

gc.disable()  # as the bootstrap runs

import http.client  # noqa: E402
import ssl  # noqa: E402
import zlib  # noqa: E402
from urllib.parse import urlencode  # noqa: E402

import msgspec  # noqa: E402
import msgspec.json  # noqa: E402
from _phase_marks import ENV, Phases  # noqa: E402
from npu_job.bootstrap.accelerator import ZLIB_NG  # noqa: E402
from npu_job.bootstrap.podtypes import pod_page_decoder  # noqa: E402

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
PAGE = "500"
phases = Phases("start-up and imports", marking=os.environ.get(ENV) == "1")
phase = phases.begin
pages: List[Any] = []  # kept until the process ends, as the bootstrap keeps what it listed


def main() -> int:
    decode = pod_page_decoder(msgspec).decode  # counted with the imports
    phase("TLS and HTTP")
    account = os.environ.get("NPU_JOB_K8S_SA_DIR", SERVICE_ACCOUNT)
    with open(os.path.join(account, "token")) as file:
        token = file.read().strip()
    with open(os.path.join(account, "namespace")) as file:
        namespace = file.read().strip()
    context = ssl.create_default_context(cafile=os.path.join(account, "ca.crt"))
    connection = http.client.HTTPSConnection(
        os.environ["KUBERNETES_SERVICE_HOST"],
        int(os.environ["KUBERNETES_SERVICE_PORT"]),
        context=context,
    )
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
        "Accept-Encoding": "gzip",
    }
    selector = {"labelSelector": f"volcano.sh/job-name={os.environ['MA_VJ_NAME']}"}
    query = {**selector, "limit": PAGE, "resourceVersion": "0"}
    pods = 0
    while True:
        connection.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods?{urlencode(query)}", headers=headers
        )
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            sys.stderr.write(f"least pod reader: HTTP {response.status}\n")
            return 1
        if response.getheader("Content-Encoding") == "gzip":
            phase("inflating")
            # as the bootstrap inflates: the deflate stream alone, no CRC-32 (TLS authenticated
            # it); a header without optional fields (10 bytes), as the API server writes it
            inflater = ZLIB_NG.for_size(int.from_bytes(body[-4:], "little")) or zlib
            body = inflater.decompressobj(-zlib.MAX_WBITS).decompress(memoryview(body)[10:])
        phase("decoding")
        page = decode(body)
        pages.append(page)
        pods += len(page.items)
        token_ = page.metadata.continue_ if page.metadata is not None else None
        if not token_:
            break
        phase("TLS and HTTP")
        query = {**selector, "limit": PAGE, "continue": token_}
    phase("the rest")
    expected = os.environ.get("MA_NUM_HOSTS")
    if expected and pods != int(expected):
        sys.stderr.write(f"least pod reader: read {pods} pods, expected {expected}\n")
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    phases.write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as bootstrap.sh exits: what was read goes with the process
