"""Building the job's bundle: the pod side of npu-job as one self-contained, reproducible file.

``npu-job render`` puts it in the job's scripts ConfigMap and ``npu-job bundle -o FILE`` writes it
for users who host it themselves. The file is a shell preamble followed by a zip archive (a
zipapp: Python finds the archive at the end of the file whatever precedes it):

* ``bash npu-job.pyz [OPTIONS]`` runs the bootstrap (what the platform's routing guide runs as
  its fetched ``bootstrap.sh``); ``bash npu-job.pyz run ...`` runs npu-run;
* ``python3 npu-job.pyz {bootstrap|run|version} ...`` does the same without the preamble.

The preamble starts ``$NPU_JOB_PYTHON`` (default ``python3``) on a loader that first checks that
the archive is readable, so that a truncated file is one ``npu-job: error:`` line (exit 10), not
Python's own message; then :mod:`npu_job.pod.bundled` checks the running copy and the digest.

What it holds: the bootstrap and launcher packages and the shared core modules they import, as
sources (``.pyc`` files are tied to one interpreter version; the bundle serves 3.7 through 3.14),
with docstrings and comments blanked and every line kept where it was, so a traceback's line
numbers are those of the repository at the same version, in half the size (the ConfigMap must
stay small enough for ``kubectl apply``'s last-applied annotation, 256 KiB). The same sources
give a byte-identical file: entries in name order, fixed timestamps and modes.

:func:`build` is pure (files in, bytes out); :func:`pod_side_files` reads them from the installed
package (the edge).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Iterable, List, Sequence, Tuple

from npu_job import __version__

#: The file name of the bundle in the job's scripts ConfigMap (beside bootstrap.sh and train.sh).
BUNDLE_NAME = "npu-job.pyz"
#: The entry Python runs for ``python3 npu-job.pyz``; it carries the digest, so it is not hashed.
MAIN_ENTRY = "__main__.py"
DIGEST_PREFIX = "sha256:"


def content_digest(entries: Iterable[Tuple[str, bytes]]) -> str:
    """``sha256:<hex>`` of a bundle's entries (name, bytes), ``__main__.py`` left out.

    Names and contents are length-prefixed, so no two different sets of entries give the same
    stream; entries are taken in name order, so the order of an archive does not matter.
    """
    digest = hashlib.sha256()
    for name, data in sorted(entries):
        if name == MAIN_ENTRY:
            continue
        encoded = name.encode("utf-8")
        digest.update(b"%d:%s%d:" % (len(encoded), encoded, len(data)))
        digest.update(data)
    return DIGEST_PREFIX + digest.hexdigest()


def short_digest(digest: str) -> str:
    """The digest as the identity line shows it: the algorithm and 12 hex digits."""
    return digest[: len(DIGEST_PREFIX) + 12]


#: The packages the bundle holds whole, and the shared core's modules they import (a test checks
#: that every ``npu_job`` import of a bundled module is bundled too).
BUNDLED_PACKAGES = ("npu_job.bootstrap", "npu_job.launcher", "npu_job.pod")
CORE_MODULES = (
    "__init__",
    "bundle",
    "errors",
    "fileio",
    "logs",
    "parsing",
    "podfacts",
    "polling",
)
#: zip's earliest date: an entry's timestamp must not depend on when or where it was built.
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
ENTRY_MODE = 0o644

# The loader runs as ``python -c`` inside single quotes: no single quote may appear in it. It is
# Python 3.7 code using the standard library only.
_LOADER = """\
import sys, zipimport
bundle = sys.argv[1]
try:
    zipimport.zipimporter(bundle)
except Exception as error:
    sys.stderr.write("npu-job: error: %s: not a readable npu-job bundle (%s)\\n" % (bundle, error))
    sys.exit(10)
del sys.argv[0]
import runpy
runpy.run_path(bundle, run_name="__main__")
"""

_PREAMBLE = """\
#!/bin/sh
# npu-job {version}, bundle {digest}: the pod side of npu-job (bootstrap, npu-run) in one file.
#   bash {name} [OPTIONS]         the bootstrap (the same as: bash {name} bootstrap [OPTIONS])
#   bash {name} run [ARGS]        npu-run, torchrun-compatible
#   python3 {name} version        the version and the digest of what the bundle holds
# $NPU_JOB_PYTHON picks the interpreter (default python3). Written by npu-job bundle / render.
case "${{1:-}}" in bootstrap|run|version) ;; *) set -- bootstrap "$@" ;; esac
exec "${{NPU_JOB_PYTHON:-python3}}" -c '{loader}' "$0" "$@"
"""

_MAIN = """\
# npu-job {version}, bundle {digest} (the digest of every entry but this one)
import os
import sys

from npu_job.pod.bundled import main

sys.exit(main(os.path.dirname(__file__), {digest!r}))
"""


@dataclass(frozen=True)
class Bundle:
    """A built bundle: its bytes and what identifies it."""

    data: bytes
    digest: str  # content_digest of the entries (what the pod's first log line shows)
    version: str
    entries: int
    source_bytes: int  # the sources before blanking, for the size report

    @property
    def short_digest(self) -> str:
        return short_digest(self.digest)


def strip_prose(source: str) -> str:
    """``source`` with docstrings and comments blanked, every line where it was.

    A docstring becomes ``""`` followed by as many newlines as it spanned; a comment is cut off
    its line. The result compiles to the same code on the same line numbers (tests check the
    syntax trees).
    """
    import ast
    import io
    import tokenize

    lines = source.splitlines(keepends=True)
    spans: List[Tuple[Tuple[int, int], Tuple[int, int], str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            spans.append((token.start, token.end, ""))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
                and first.end_col_offset is not None
            ):
                newlines = "\n" * (first.end_lineno - first.lineno)
                start = (first.lineno, _column(lines, first.lineno, first.col_offset))
                end = (first.end_lineno, _column(lines, first.end_lineno, first.end_col_offset))
                spans.append((start, end, '""' + newlines))
    # from the end, so that earlier positions stay valid; columns are of the line's own text
    for (start_line, start_col), (end_line, end_col), replacement in sorted(spans, reverse=True):
        head = lines[start_line - 1][:start_col]
        tail = lines[end_line - 1][end_col:]
        if not replacement:  # a comment: drop it and the spaces before it
            head = head.rstrip()
        lines[start_line - 1 : end_line] = [head + replacement + tail]
    return "".join(lines)


def _column(lines: Sequence[str], line: int, utf8_offset: int) -> int:
    """ast's column (UTF-8 bytes into the line) as a character index, as tokenize counts."""
    return len(lines[line - 1].encode("utf-8")[:utf8_offset].decode("utf-8"))


def build(files: Iterable[Tuple[str, str]], version: str = __version__) -> Bundle:
    """The bundle of ``files`` (archive name, Python source): preamble, then a zip archive."""
    import io
    import zipfile

    stripped = sorted((name, strip_prose(text).encode("utf-8")) for name, text in files)
    source_bytes = sum(len(text.encode("utf-8")) for _, text in files)
    digest = content_digest(stripped)
    main_entry = _MAIN.format(version=version, digest=digest).encode("utf-8")
    entries = sorted([*stripped, (MAIN_ENTRY, main_entry)])
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        for name, data in entries:
            info = zipfile.ZipInfo(name, FIXED_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ENTRY_MODE << 16
            info.create_system = 3  # Unix, whatever the building machine is
            zipped.writestr(info, data, compresslevel=9)
    preamble = _PREAMBLE.format(
        version=version, digest=digest, name=BUNDLE_NAME, loader=_LOADER.rstrip("\n")
    ).encode("utf-8")
    return Bundle(preamble + archive.getvalue(), digest, version, len(entries), source_bytes)


def pod_side_files() -> List[Tuple[str, str]]:
    """(archive name, source) of every module the bundle holds, read from this installation."""
    import importlib.util
    from pathlib import Path

    import npu_job

    core = Path(npu_job.__file__).parent
    files = [(f"npu_job/{name}.py", core / f"{name}.py") for name in CORE_MODULES]
    for package_name in BUNDLED_PACKAGES:
        spec = importlib.util.find_spec(package_name)  # where it is, without running its code
        if spec is None or not spec.submodule_search_locations:
            from npu_job.errors import NpuJobError

            raise NpuJobError(f"{package_name}: not importable here, so it cannot be bundled")
        root = Path(list(spec.submodule_search_locations)[0])
        prefix = package_name.replace(".", "/")
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" not in path.parts:
                files.append((f"{prefix}/{path.relative_to(root).as_posix()}", path))
    return [(name, path.read_text(encoding="utf-8")) for name, path in files]


@functools.lru_cache(maxsize=None)
def installed_bundle() -> Bundle:
    """The bundle of this installation's pod side (built once per process)."""
    return build(pod_side_files())
