"""The 64 MiB cap holds for every input, whatever its format and however it is compressed.

A gzip bomb (a few KiB of base64 that inflate past the cap) given as any topology must be refused
by the cap's own message on the pod path, with ``--strict`` and in ``npu-job plan``: the formats
that may be YAML once read it as a YAML string instead and said "expected an object".
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import pytest

from npu_job.bootstrap.payload import MAX_INPUT_BYTES
from tests.bootstrap.documents import v1_0
from tests.cli.bad_input import V1_0_IDS, assert_one_line_error, clean_environment, run_everywhere

@pytest.fixture(scope="module")
def bomb() -> bytes:
    """base64(gzip(JSON)) of a document one byte over the cap once inflated."""
    text = b'{"servers": {"a": "' + b"x" * (MAX_INPUT_BYTES - 20) + b'"}}'
    assert len(text) > MAX_INPUT_BYTES
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return base64.b64encode(compressor.compress(text) + compressor.flush())


@pytest.mark.parametrize("fmt", [None, "file", "basic-tor-node-cm", "cce-ranktable-tor", "k8s-node-labels"],
                         ids=lambda fmt: fmt or "detected")
def test_a_gzip_bomb_as_a_topology_is_refused_at_the_cap(tmp_path: Path, capsys, monkeypatch, bomb, fmt):
    clean_environment(monkeypatch)
    rank_table = tmp_path / "jobstart_hccl.json"
    rank_table.write_text(json.dumps(v1_0()))
    topology = tmp_path / "topology.yaml"
    topology.write_bytes(bomb)
    outcome = run_everywhere(rank_table, topology, V1_0_IDS[0], tmp_path / "out", capsys, "stdlib", fmt)
    line = assert_one_line_error(outcome, f"{topology}: content: expected at most 64 MiB")
    assert "after decompression" in line
