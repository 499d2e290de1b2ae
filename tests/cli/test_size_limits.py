"""The 64 MiB cap holds for every input, whatever its format and however it is compressed.

A gzip bomb (a few KiB of base64 that inflate past the cap) given as any topology must be refused
by the cap's own message on the pod path, with ``--strict`` and in ``npu-job plan``: the formats
that may be YAML once read it as a YAML string instead and said "expected an object".
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Tuple

import pytest
from npu_job.bootstrap.base import jsondecode
from npu_job.bootstrap.base.payload import MAX_INPUT_BYTES

from tests.bootstrap.documents import ranktable_tor, tor_info, v1_0
from tests.bootstrap.engines import ENGINES
from tests.cli.bad_input import (
    TOR_INFO_IDS,
    V1_0_IDS,
    assert_one_line_error,
    clean_environment,
    run_everywhere,
)


def _b64_gzip(data: bytes, level: int = 1) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return base64.b64encode(compressor.compress(data) + compressor.flush())


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """base64(gzip(JSON)) of a document one byte over the cap once inflated."""
    text = b'{"servers": {"a": "' + b"x" * (MAX_INPUT_BYTES - 20) + b'"}}'
    assert len(text) > MAX_INPUT_BYTES
    return _b64_gzip(text, 9)


@pytest.mark.parametrize(
    "fmt",
    [None, "file", "basic-tor-node-cm", "cce-ranktable-tor", "k8s-node-labels"],
    ids=lambda fmt: fmt or "detected",
)
def test_a_gzip_bomb_as_a_topology_is_refused_at_the_cap(
    tmp_path: Path, capsys, monkeypatch, bomb, fmt
):
    clean_environment(monkeypatch)
    rank_table = tmp_path / "jobstart_hccl.json"
    rank_table.write_text(json.dumps(v1_0()))
    topology = tmp_path / "topology.yaml"
    topology.write_bytes(bomb)
    outcome = run_everywhere(
        rank_table, topology, V1_0_IDS[0], tmp_path / "out", capsys, "stdlib", fmt
    )
    line = assert_one_line_error(outcome, f"{topology}: content: expected at most 64 MiB")
    assert "after decompression" in line


# --- memory: decoding costs per value, not per byte --------------------------------------------

MEMORY_LIMIT_KIB = (
    1 << 20
)  # the promise: the bootstrap stays under 1 GiB for any input under the cap
JUNK_ITEMS = 20_000_000  # "{}," x 20M: 60 MB of text, ~1.5 GiB once decoded (before the cap)


def _bootstrap_peak_kib(tmp_path: Path, flags, engine: str) -> Tuple[int, str]:
    """Run ``python -m npu_job.bootstrap FLAGS`` as a pod would (a child process) under ``engine``;
    return its peak RSS in KiB as the kernel counts it, and its stderr."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NPU_JOB_", "KUBERNETES_", "MA_", "VC_", "RANK_TABLE"))
    }
    env.update(NPU_JOB_WAIT_TIMEOUT="0", NPU_JOB_K8S_TOPOLOGY="0")
    if engine == "stdlib":  # as in an image without msgspec: `import msgspec` fails
        hidden = tmp_path / "no-msgspec" / "msgspec"
        hidden.mkdir(parents=True)
        (hidden / "__init__.py").write_text('raise ImportError("hidden by the test")\n')
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(hidden.parent), env.get("PYTHONPATH")])
        )
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "npu_job.bootstrap", *flags],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        _, status, usage = os.wait4(child.pid, 0)
        stderr.seek(0)
        assert os.waitstatus_to_exitcode(status) == 0
        return usage.ru_maxrss, stderr.read().decode()


def _with_junk(document: dict, where: str) -> bytes:
    """``document`` with an ignored field of JUNK_ITEMS empty objects (top level) or empty arrays
    (in the first server entry)."""
    (document if where == "top" else document["server_list"][0])["junk"] = "<junk>"
    item = b"{}" if where == "top" else b"[]"
    junk = b"[" + (item + b",") * (JUNK_ITEMS - 1) + item + b"]"
    return json.dumps(document).encode().replace(b'"<junk>"', junk)


JUNK_CASES = {  # which file holds the junk, and where in it
    "rank-table-top-level": ("jobstart_hccl.json", "top"),
    "rank-table-server": ("jobstart_hccl.json", "server"),
    "ranktable-tor-top-level": ("ranktable_tor.json", "top"),  # read server by server on the pod
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("encoding", ["json", "b64-gzip"])
@pytest.mark.parametrize("case", list(JUNK_CASES))
def test_an_input_of_many_small_values_is_refused_before_it_is_built(
    tmp_path, engine, encoding, case
):
    """60 MB of ``{},`` in a field no reader reads peaked at 1.5 GiB; now refused by its estimated
    decoded size, in one line, the pod keeping the scheduler's order."""
    name, where = JUNK_CASES[case]
    config = tmp_path / "config"
    config.mkdir()
    documents = {
        "jobstart_hccl.json": v1_0(),
        "ranktable_tor.json": ranktable_tor(
            {sid: ["tor-a" if i % 2 else "tor-b"] * 2 for i, sid in enumerate(V1_0_IDS)}
        ),
    }
    for file_name, document in documents.items():
        data = _with_junk(document, where) if file_name == name else json.dumps(document).encode()
        (config / file_name).write_bytes(_b64_gzip(data) if encoding == "b64-gzip" else data)
    del data
    peak, stderr = _bootstrap_peak_kib(
        tmp_path,
        [
            "--rank-table",
            str(config),
            "--host-ip",
            V1_0_IDS[0],
            "--output-dir",
            str(tmp_path / "out"),
        ],
        engine,
    )
    assert peak < MEMORY_LIMIT_KIB, f"peak RSS {peak >> 10} MiB"
    assert (
        f"npu-job: error: {config / name}: content: expected a document that decodes into at most 384 MiB"
        in stderr
    ), stderr[-500:]


def _at_the_cap(document: dict, item: bytes, pad_first: str, size: int) -> bytes:
    """``document`` with a field of as many ``item`` as the decoded-size cap admits and a string
    (starting with ``pad_first``) filling the text to ``size`` bytes."""
    head = json.dumps(dict(document, junk="<junk>", pad="<pad>")).encode()

    def build(count: int) -> bytes:
        text = head.replace(b'"<junk>"', b"[" + (item + b",") * (count - 1) + item + b"]")
        pad = pad_first.encode()
        return text.replace(
            b'"<pad>"', b'"' + pad + b"a" * (size - len(text) - len(pad) + 5) + b'"'
        )

    one = build(1)  # each further item adds its values and a comma to decoded_size's count
    per_item = jsondecode.decoded_size(build(2)) - jsondecode.decoded_size(one)
    count = 1 + (jsondecode.MAX_DECODED_BYTES - jsondecode.decoded_size(one)) // per_item
    text = build(count)
    assert (
        len(text) == size
        and jsondecode.fits_decoded(text)
        and not jsondecode.fits_decoded(build(count + 1))
    )
    return text


def test_the_costliest_inputs_the_caps_admit_stay_under_1_gib(tmp_path):
    """The densest shapes measured, at the cap, in both files of one pod (the rank table is kept
    while the topology decodes), on the standard library (which also holds the text as str):
    nested one-key objects in 64 MiB of rank table, strings of 4-byte characters in a tor_info."""
    chain = b'{"a":' * 500 + b"0" + b"}" * 500
    rank_table, topology = tmp_path / "jobstart_hccl.json", tmp_path / "tor_info.json"
    rank_table.write_bytes(_at_the_cap(v1_0(TOR_INFO_IDS), chain, "a", 64 << 20))
    topology.write_bytes(_at_the_cap(tor_info(), '"\U0001f600a"'.encode(), "\U0001f600", 40 << 20))
    peak, stderr = _bootstrap_peak_kib(
        tmp_path,
        [
            "--rank-table",
            str(rank_table),
            "--topology",
            str(topology),
            "--host-ip",
            TOR_INFO_IDS[0],
            "--output-dir",
            str(tmp_path / "out"),
        ],
        "stdlib",
    )
    assert "npu-job: node rank 0 of 3" in stderr, stderr[-500:]  # read, planned and written
    assert peak < MEMORY_LIMIT_KIB, f"peak RSS {peak >> 10} MiB"
