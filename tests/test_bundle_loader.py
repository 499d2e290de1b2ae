"""The bundle's modules are imported from its one zlib stream, in memory, as from files.

After the digest check, the bundle's ``__main__.py`` inflates the stream of sources (stored in a
few chunk entries) and puts a finder first on ``sys.meta_path``: every ``npu_job`` module then
comes from the bundle, with a ``__file__`` inside it (``.../npu-job.pyz/npu_job/...``), its source
for tracebacks (linecache asks the loader) and for :mod:`npu_job.launcher.pdeath`, which hands
its own source to the worker's wrapper. A process that did not start from the entry point (a
multiprocessing spawn child, which imports by name from the parent's ``sys.path``) finds the
one module zipimport sees, which checks and installs the same. On CPython 3.7 (the bootstrap's floor, from pyenv where
there is one) as on this interpreter. A stream that does not inflate, in a file whose digest holds
all the same, is one ``npu-job: error:`` line and exit 10.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, List, Tuple

import pytest
from npu_job.demo.images import find_interpreter

from npu_job.bundle import (
    BUNDLE_NAME,
    CHUNK_PREFIX,
    DIGEST_FIELD,
    DIGEST_PREFIX,
    MAIN_ENTRY,
    PACKAGE_ENTRY,
    build,
    file_digest,
    pod_side_files,
    strip_prose,
    zip_archive,
)
from npu_job.errors import BundleError

ENTRY = "npu_job/pod/bundled.py"

# stands in for the pod's entry module: it reports where its modules came from, then formats the
# traceback of a failure as npu-job's logging does (the traceback module, through linecache; the
# interpreter's own last-resort hook reads no loader, from a zip archive neither)
PROBE = '''\
"""Where the bundle's modules come from."""
import json
import multiprocessing
import os
import subprocess
import sys
import traceback

import npu_job
from npu_job.launcher import pdeath


def child(path):
    import npu_job

    sys.exit(0 if npu_job.__file__.startswith(path) else 5)


def main(path, digest):
    spawned = multiprocessing.get_context("spawn").Process(target=child, args=(path,))
    spawned.start()
    spawned.join()
    done = subprocess.run(
        [sys.executable, *pdeath.launch(), "--parent=%d" % os.getpid(), "-c", "print(42)"],
        stdout=subprocess.PIPE,
    )
    from npu_job.launcher.probe import worker

    config = worker.ProbeConfig("127.0.0.1", 1, "p", {}, 1, "gloo", "cpu", "all_reduce", (), 1, 0, 1, 0.0)
    probe_env = worker.child_env(config, dict(os.environ))
    del probe_env[worker.CONFIG_ENV]  # it imports, then says what it misses
    probe = subprocess.run(
        [sys.executable, "-m", "npu_job.launcher.probe.worker"],
        env=probe_env,
        stderr=subprocess.PIPE,
    )
    facts = dict(
        package=npu_job.__file__,
        package_path=list(npu_job.__path__),
        pdeath=pdeath.__file__,
        wrapper_output=done.stdout.decode().strip(),
        spawned_child_exit=spawned.exitcode,
        probe_process=[probe.returncode, probe.stderr.decode().strip()],
        installed_copy_shadowed=all(
            getattr(module, "__file__", "").startswith(path)
            for name, module in sys.modules.items()
            if name.startswith("npu_job")
        ),
    )
    print(json.dumps(facts))
    sys.stdout.flush()
    try:
        fail()
    except RuntimeError:
        traceback.print_exc()
    return 3


def fail():
    raise RuntimeError("raised from the bundle")  # the line the traceback shows
'''
FAILING_LINE = (
    PROBE.splitlines().index(
        '    raise RuntimeError("raised from the bundle")  # the line the traceback shows'
    )
    + 1
)


def _probe_bundle() -> bytes:
    files = [(name, PROBE if name == ENTRY else text) for name, text in pod_side_files()]
    return build(files).data


def _pythons() -> List[str]:
    found = [sys.executable]
    floor = find_interpreter((3, 7))
    return found + [floor] if floor else found


@pytest.mark.parametrize("python", _pythons())
def test_modules_come_from_the_bundles_stream_with_their_files_and_lines(
    tmp_path: Path, python: str
) -> None:
    path = tmp_path / BUNDLE_NAME
    path.write_bytes(_probe_bundle())
    done = subprocess.run(
        [python, str(path), "version"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 3, done.stderr
    facts = json.loads(done.stdout)
    assert facts == {
        "package": f"{path}/npu_job/__init__.py",
        "package_path": [f"{path}/npu_job"],
        "pdeath": f"{path}/npu_job/launcher/pdeath.py",
        "wrapper_output": "42",  # the wrapper ran on pdeath's source, read from the stream
        "spawned_child_exit": 0,  # a spawn child imported the bundle's npu_job by name
        # npu-run --probe's processes, fresh interpreters, import the bundle's modules too
        "probe_process": [2, "npu-run: probe: NPU_RUN_PROBE_CONFIG is not set"],
        "installed_copy_shadowed": True,
    }
    lines = done.stderr.splitlines()
    frame = lines.index(f'  File "{path}/{ENTRY}", line {FAILING_LINE}, in fail')
    # the comment blanked, the code kept
    assert lines[frame + 1] == '    raise RuntimeError("raised from the bundle")', done.stderr
    assert lines[-1] == "RuntimeError: raised from the bundle"


def _resigned(data: bytes) -> bytes:
    """``data`` with the digest it computes written into its field, as a builder would."""
    _, computed = file_digest(data)
    start = data.index(DIGEST_FIELD.encode()) + len(DIGEST_FIELD)
    return data[:start] + computed[len(DIGEST_PREFIX) :].encode() + data[start + 64 :]


def _rearchived(data: bytes, change: Callable[[List[Tuple[str, bytes]]], None]) -> bytes:
    """``data``'s archive made again from its entries as ``change`` leaves them, then signed."""
    archive = zipfile.ZipFile(io.BytesIO(data))
    entries = [(name, archive.read(name)) for name in archive.namelist()]
    change(entries)
    stored = {name for name, _ in entries if name.startswith(CHUNK_PREFIX)} | {PACKAGE_ENTRY}
    made = data[: data.index(b"PK\x03\x04")] + zip_archive(entries, stored=stored)
    return _resigned(made)


def _last_chunk_dropped(entries: List[Tuple[str, bytes]]) -> None:
    entries.pop()


def _a_byte_flipped_in_the_stream(entries: List[Tuple[str, bytes]]) -> None:
    name, chunk = entries[2]
    entries[2] = (name, chunk[:1000] + bytes([chunk[1000] ^ 0x01]) + chunk[1001:])


def _no_chunks(entries: List[Tuple[str, bytes]]) -> None:
    del entries[2:]


@pytest.mark.parametrize(
    "damage",
    [_last_chunk_dropped, _a_byte_flipped_in_the_stream, _no_chunks],
    ids=lambda damage: damage.__name__.strip("_"),
)
@pytest.mark.parametrize("way", ["sh", "python3"])
def test_a_stream_that_does_not_inflate_is_one_line_and_exit_10(
    tmp_path: Path, damage: Callable[[List[Tuple[str, bytes]]], None], way: str
) -> None:
    from npu_job.bundle import installed_bundle

    data = _rearchived(installed_bundle().data, damage)
    recorded, computed = file_digest(data)
    assert recorded == computed, "the digest holds: the stream is what fails"
    path = tmp_path / BUNDLE_NAME
    path.write_bytes(data)
    command = ["sh", str(path)] if way == "sh" else [sys.executable, str(path)]
    done = subprocess.run(
        [*command, "version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"NPU_JOB_PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    errors = [line for line in done.stderr.splitlines() if not line.startswith("npu-job: TIP:")]
    assert done.returncode == BundleError.exit_code, done.stderr
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors[0].startswith(f"npu-job: error: {path}: altered: its sources do not inflate")


def test_the_entry_point_stays_a_deflated_entry_of_its_own_ahead_of_the_stream() -> None:
    """The loader reads ``__main__.py`` alone (zipfile checks its CRC) before any source."""
    data = build([("npu_job/__init__.py", '"""Doc."""\n__version__ = "0"\n')]).data
    archive = zipfile.ZipFile(io.BytesIO(data))
    infos = archive.infolist()
    assert infos[0].filename == MAIN_ENTRY and infos[0].compress_type == zipfile.ZIP_DEFLATED
    assert [info.filename for info in infos[1:]] == [PACKAGE_ENTRY, f"{CHUNK_PREFIX}00"]
    assert strip_prose('"""Doc."""\n__version__ = "0"\n').encode() in __import__("zlib").decompress(
        archive.read(f"{CHUNK_PREFIX}00")
    )
