"""Building the job's bundle: the pod side of npu-job as one self-contained, reproducible file.

``npu-job render`` puts it in the job's scripts ConfigMap and ``npu-job bundle -o FILE`` writes it
for users who host it themselves. The file is a prologue followed by a zip archive (a zipapp:
Python finds the archive at the end of the file whatever precedes it):

* ``bash npu-job.pyz [OPTIONS]`` runs the bootstrap (what the platform's routing guide runs as
  its fetched ``bootstrap.sh``); ``bash npu-job.pyz run ...`` runs npu-run;
* ``python3 npu-job.pyz {bootstrap|run|version} ...`` does the same without the shell.

What runs, in order, and what each part answers for:

1. **The prologue**, which sh reads as a shell script. It picks the command and starts
   ``$NPU_JOB_PYTHON`` (default ``python3``) on a loader (``-c``) that checks that the archive
   ends where the file does, opens it and reads its ``__main__.py`` (zipfile checks the CRC), so
   that a file cut short or a damaged entry point is one ``npu-job: error:`` line (exit 10); then
   it runs ``__main__.py``. That is what the pod runs (bootstrap.sh, train.sh).
   ``python3 npu-job.pyz`` on a file cut short finds no archive at its end. CPython 3.8 and later
   then look back up to 64 KiB for one, and find a *sentinel* (:mod:`npu_job.bundlezip`): a
   small archive, copies of which lie between the entries, whose ``__main__.py`` prints the loader's
   line and exits 10. CPython 3.7 compiles the whole file as a script instead, and no code of a
   file runs before all of it compiles; the prologue, which Python reads as a string and then an
   unterminated one, makes the error it shows (exit 1) hold the loader's line.
2. **__main__.py**, the first Python of the archive to run either way, in Python that every
   interpreter parses (2.7 included), on the standard library alone. It checks the interpreter
   against the command's floor (:data:`FLOORS`) before any module with newer syntax is compiled:
   below it, one line names the version found and the floor; the bootstrap then writes its
   ``route_plan.json`` (status ``failed``) and keeps the scheduler order (exit 0; ``--strict``:
   :data:`FLOOR_EXIT`, the code of npu-run on a Python without torch). Then it checks the whole
   file against its digest; only then does it inflate the sources and put a finder first on
   ``sys.meta_path`` that imports the bundle's modules from them, in memory (a SourceLoader:
   ``__file__`` is ``.../npu-job.pyz/npu_job/...`` and linecache gets the source from it, so
   tracebacks show the lines), and import :mod:`npu_job.pod.bundled`. A stream that does not
   inflate is one line too (exit 10).

**The digest** (``sha256:<hex>``: the prologue's second line, ``version`` and the pod's identity
line) is the SHA-256 of the whole file with its own 64 hex digits read as ``0``. It lives in the
file it names, so its own field is the one thing it cannot hash, and that field is covered all the
same: a change in it makes the recorded digest differ from the computed one. So one rule covers
every byte that runs (shell, loader, ``__main__.py``, every entry, the archive's directory), and
it is checked before any module of the archive is imported. That is simpler than the other sound
design, a digest of the prologue beside one of the entries: two rules, and the archive's
directory still outside both. The digest names the file, not the sources: another zlib would
compress the same sources into other bytes, with another digest; every pod of a job gets the same
file.

What it holds: the bootstrap and launcher packages and the shared core modules they import, as
sources (``.pyc`` files are tied to one interpreter version; the bundle serves 3.7 through 3.14),
with docstrings and comments blanked and every line kept where it was, so a traceback's line
numbers are those of the repository at the same version, in half the size (the ConfigMap must
stay small enough for ``kubectl apply``'s last-applied annotation: :mod:`npu_job.render.render`).
The sources, in name order, are one zlib stream (solid: a quarter smaller than an entry deflated
for each, whose headers add more), cut into a few stored chunks (:data:`CHUNK_BYTES`) so that a
sentinel lies within reach of any cut; zlib is the one compressor every image's Python has. The
same sources give a byte-identical file: fixed timestamps and modes, and between the entries a
few copies of a small archive of its own that ``python3 npu-job.pyz`` finds in a file cut short.

:func:`build` is pure (files in, bytes out); :func:`pod_side_files` reads them from the installed
package (the edge).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from npu_job import __version__, podfacts
from npu_job.bundlezip import strip_prose, zip_archive
from npu_job.errors import BundleError, MissingExtraError
from npu_job.parsing import TRUE_WORDS

#: The file name of the bundle in the job's scripts ConfigMap (beside bootstrap.sh and train.sh).
BUNDLE_NAME = "npu-job.pyz"
#: The entry Python runs for ``python3 npu-job.pyz`` (the loader runs it for ``bash``).
MAIN_ENTRY = "__main__.py"
DIGEST_PREFIX = "sha256:"
#: The oldest Python each command runs on: the bootstrap and the shared core, npu-run.
FLOORS: Dict[str, Tuple[int, int]] = {"bootstrap": (3, 7), "version": (3, 7), "run": (3, 8)}
#: What a command adds to its floor's line: whose floor it is, and what names another Python.
FLOOR_ADVICE = {
    "bootstrap": f"the bootstrap's oldest ({podfacts.PYTHON_ENV} names another interpreter)",
    "version": f"the bundle's oldest ({podfacts.PYTHON_ENV} names another interpreter)",
    "run": f"npu-run's oldest (train.sh runs it on ${podfacts.LAUNCHER_PYTHON_ENV}, else "
    f"${podfacts.PYTHON_ENV})",
}
#: The exit code of an interpreter below the floor (the bootstrap's with ``--strict`` only): the
#: README's "needs what is not installed", as npu-run's on a Python without torch.
FLOOR_EXIT = MissingExtraError.exit_code
#: What the loader, the sentinels and the prologue read as Python say of a file with no archive at
#: its end.
UNREADABLE = "not a readable npu-job bundle (no zip archive at its end: cut short?)"
ALTERED_TIP = "render the job again (npu-job render) or write the bundle again (npu-job bundle)"
#: Where the prologue records the digest: the first occurrence of this text, then 64 hex digits,
#: within the file's first DIGEST_FIELD_WITHIN bytes.
DIGEST_FIELD = "bundle " + DIGEST_PREFIX
DIGEST_HEX = 64
DIGEST_FIELD_WITHIN = 512

# The digest rule in Python that every interpreter parses: __main__.py carries this text and the
# builder runs the same text (below), so that the pod and the builder cannot disagree.
_DIGEST_RULE = f"""\
DIGEST_PREFIX = {DIGEST_PREFIX!r}
DIGEST_FIELD = {DIGEST_FIELD!r}
DIGEST_HEX = {DIGEST_HEX!r}
DIGEST_FIELD_WITHIN = {DIGEST_FIELD_WITHIN!r}


def file_digest(data):
    '''(recorded, computed): the digest a bundle's bytes record (None: no field) and have.'''
    import hashlib
    start = data.find(DIGEST_FIELD.encode("ascii"), 0, DIGEST_FIELD_WITHIN)
    if start < 0:
        return None, DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
    start += len(DIGEST_FIELD)
    end = start + DIGEST_HEX
    recorded = data[start:end].decode("ascii", "replace")
    masked = data[:start] + b"0" * DIGEST_HEX + data[end:]
    return DIGEST_PREFIX + recorded, DIGEST_PREFIX + hashlib.sha256(masked).hexdigest()
"""
#: The names of the stored entries whose bytes, joined in name order, are the zlib stream of the
#: sources (a few, so that a sentinel lies within reach of any cut: npu_job.bundlezip).
CHUNK_PREFIX = "npu_job.zlib."
CHUNK_BYTES = 48 * 1024

# The sources' stream, read by __main__.py as by the builder (below): one zlib stream of records,
# each the archive name, a newline, the source's length in bytes, a newline and the source.
_SOURCES_RULE = f"""\
CHUNK_PREFIX = {CHUNK_PREFIX!r}


def read_sources(stream):
    '''The sources of a stream of records, by archive name (zlib.error, ValueError: damaged).'''
    import zlib
    data = zlib.decompress(stream)
    sources = dict()
    at = 0
    while at < len(data):
        name_end = data.index(b"\\n", at)
        size_end = data.index(b"\\n", name_end + 1)
        start = size_end + 1
        end = start + int(data[name_end + 1:size_end])
        if end > len(data):
            raise ValueError("a source runs past the stream's end")
        sources[data[at:name_end].decode("utf-8")] = data[start:end]
        at = end
    return sources


def module_name(name):
    '''The module an archive name holds: npu_job/pod/__init__.py is npu_job.pod.'''
    dotted = name[:-len(".py")].replace("/", ".")
    return dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted

def bundled_sources(data):
    '''The sources a bundle's bytes hold, by archive name: its chunks, joined in name order.'''
    import io
    import zipfile

    archive = zipfile.ZipFile(io.BytesIO(data))
    chunks = sorted(name for name in archive.namelist() if name.startswith(CHUNK_PREFIX))
    return read_sources(b"".join(archive.read(name) for name in chunks))


"""
_rule: Dict[str, object] = {}
exec(_DIGEST_RULE, _rule)
exec(_SOURCES_RULE, _rule)
#: ``file_digest(data) -> (recorded, computed)``: the digest field of a bundle's bytes (None when
#: it has none) and the digest those bytes have.
file_digest: Callable[[bytes], Tuple[Optional[str], str]] = _rule["file_digest"]  # type: ignore[assignment]


#: ``read_sources(stream) -> {archive name: source}``: what the bundle's chunks, joined, hold.
read_sources: Callable[[bytes], Dict[str, bytes]] = _rule["read_sources"]  # type: ignore[assignment]
#: ``module_name(archive name) -> dotted name``: the module a bundled source is.
module_name: Callable[[str], str] = _rule["module_name"]  # type: ignore[assignment]
#: ``bundled_sources(data) -> {archive name: source}``: the sources a bundle's bytes hold.
bundled_sources: Callable[[bytes], Dict[str, bytes]] = _rule["bundled_sources"]  # type: ignore[assignment]


def sources_stream(sources: Sequence[Tuple[str, bytes]]) -> bytes:
    """The zlib stream of ``sources`` (archive name, bytes) in their order, as
    :func:`read_sources` reads it."""
    import zlib

    records = b"".join(b"%s\n%d\n%s" % (name.encode(), len(text), text) for name, text in sources)
    return zlib.compress(records, 9)


def short_digest(digest: str) -> str:
    """The digest as the identity line shows it: the algorithm and 12 hex digits."""
    return digest[: podfacts.SHOWN_DIGEST]


#: The packages the bundle holds whole, and the shared core's modules they import (a test checks
#: that every ``npu_job`` import of a bundled module is bundled too). This module, the builder,
#: is not among them: what a pod needs of it is in ``__main__.py``.
BUNDLED_PACKAGES = ("npu_job.bootstrap", "npu_job.kinds", "npu_job.launcher", "npu_job.pod")
CORE_MODULES = (
    "__init__",
    "errors",
    "fileio",
    "logs",
    "parsing",
    "podfacts",
    "polling",
)
# The loader runs as ``python -c`` inside single quotes: no single quote may appear in it. Any
# Python parses it (2.7 included): __main__.py then says when the interpreter is too old. The
# archive must end where the file does (the bundle's archive has no comment): zipfile, like
# zipimport from 3.8 on, would take a sentinel (see zip_archive) of a file cut short for it.
_LOADER = """\
import sys, zipfile
bundle = sys.argv[1]
try:
    with open(bundle, "rb") as handle:
        handle.seek(-22, 2)
        if handle.read(4) != b"PK\\x05\\x06":
            raise ValueError("the archive does not end where the file does")
    archive = zipfile.ZipFile(bundle)
except Exception:
    sys.stderr.write("npu-job: error: %s: {unreadable}\\n" % bundle)
    sys.exit({bundle_exit})
try:
    archive.read("{main_entry}")
except Exception as error:
    sys.stderr.write("npu-job: error: %s: altered: {main_entry}: %s\\n" % (bundle, error))
    sys.stderr.write("npu-job: TIP: {tip}\\n")
    sys.exit({bundle_exit})
del sys.argv[0]
import runpy
runpy.run_path(bundle, run_name="__main__")"""

# sh reads ''':' as the command ":" and never gets past exec. Python reads a string from ''' to
# ''', then the loader's line in a string left open: when Python finds no archive at the end of
# the file it compiles the whole file as a script, and the tokenizer's error on that line, shown
# with the line, stops it before the archive's bytes (no code of a file runs before all of it
# compiles: exit 1).
_PROLOGUE = """\
#!/bin/sh
# npu-job {version}, {digest_field}{digest}: the pod side of npu-job (bootstrap, npu-run).
#   bash {name} [OPTIONS]         the bootstrap (the same as: bash {name} bootstrap [OPTIONS])
#   bash {name} run [ARGS]        npu-run, torchrun-compatible
#   python3 {name} version        the version and the digest of this file
# $NPU_JOB_PYTHON picks the interpreter (default python3). Written by npu-job bundle / render.
# The digest is the sha256 of this whole file with its 64 hex digits read as 0.
''':'
case "${{1:-}}" in bootstrap|run|version) ;; *) set -- bootstrap "$@" ;; esac
exec "${{NPU_JOB_PYTHON:-python3}}" -c '{loader}' "$0" "$@"
'''
"npu-job: error: {unreadable}
"""

#: The one module zipimport finds in the archive: what a process that did not start from the entry
#: point (a multiprocessing spawn child, given the parent's sys.path) imports as ``npu_job``.
PACKAGE_ENTRY = "npu_job/__init__.py"
# It runs the entry point's own check and finder (not its main), then puts the bundle's npu_job
# in its own place: the import system takes the module that sys.modules holds once it has run.
_PACKAGE_STUB = f"""\
import os, sys, zipfile
bundle = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
entry = dict(__name__="npu_job.__entry__", __file__=os.path.join(bundle, {MAIN_ENTRY!r}))
exec(compile(zipfile.ZipFile(bundle).read({MAIN_ENTRY!r}), entry["__file__"], "exec"), entry)
if entry["load"](bundle)[1]:
    raise ImportError("npu_job: " + bundle + ": not a readable npu-job bundle (see above)")
del sys.modules[__name__]
import npu_job
"""

# __main__.py: Python that every interpreter parses, on the standard library alone. It is filled
# in with str.format, so it holds no brace of its own.
_MAIN = """\
# npu-job {version}: the bundle's entry, the first of its Python to run. Any Python parses it, so
# that an interpreter below the floor gets one line rather than a newer module's SyntaxError.
import os
import sys

FLOORS = {floors!r}
ADVICE = {advice!r}
FLOOR_EXIT = {floor_exit!r}
BUNDLE_EXIT = {bundle_exit!r}
OUTPUT_DIR = {output_dir!r}
OUTPUT_DIR_ENV = {output_dir_env!r}
STRICT_ENV = {strict_env!r}
TRUE_WORDS = {true_words!r}
ROUTE_PLAN_FILE = {route_plan_file!r}
PLAN_FILES = {plan_files!r}
SHORT = {short!r}

{digest_rule}
{sources_rule}

def error(message):
    sys.stderr.write("npu-job: error: " + message + "\\n")


def install(bundle, data):
    '''Imports of the bundle's modules from its inflated sources, ahead of any other copy.'''
    import importlib.abc
    import importlib.util

    sources = bundled_sources(data)
    if not sources:
        raise ValueError("no sources")
    files = dict((bundle + "/" + name, text) for name, text in sources.items())
    modules = dict((module_name(name), bundle + "/" + name) for name in sources)

    class Bundled(importlib.abc.MetaPathFinder, importlib.abc.SourceLoader):
        def find_spec(self, fullname, path=None, target=None):
            if fullname not in modules:
                return None
            return importlib.util.spec_from_file_location(fullname, modules[fullname], loader=self)

        def get_filename(self, fullname):
            return modules[fullname]

        def get_data(self, path):
            if path not in files:
                raise OSError("%s: not in the bundle" % path)
            return files[path]

    sys.meta_path.insert(0, Bundled())


def flag_value(args, flag):
    '''The value of --flag VALUE or --flag=VALUE (its underscore spelling too), else None.'''
    names = (flag, "--" + flag[2:].replace("-", "_"))
    found = None
    for index, arg in enumerate(args):
        if arg in names and index + 1 < len(args):
            found = args[index + 1]
        for name in names:
            if arg.startswith(name + "="):
                found = arg[len(name) + 1:]
    return found


def fall_back(args, reason):
    '''The bootstrap's fallback without it: stale rank files removed, route_plan.json failed.'''
    import json
    out = flag_value(args, "--output-dir") or os.environ.get(OUTPUT_DIR_ENV) or OUTPUT_DIR
    plan = dict(
        version=1, npu_job_version={version!r}, status="failed", rank_mapping=None,
        reason=reason, reasons=[reason], collective=None, node_count=None, pod_index=None,
        node_rank=None, master_index=None, input_digest=None, mapping_digest=None,
        rank_table=None, topology=None,
    )
    text = json.dumps(plan, indent=2, sort_keys=True, separators=(",", ": ")) + "\\n"
    try:
        if not os.path.isdir(out):
            os.makedirs(out)
        for name in PLAN_FILES:
            if os.path.lexists(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
        target = os.path.join(out, ROUTE_PLAN_FILE)
        partial = "%s.%d.tmp" % (target, os.getpid())
        with open(partial, "wb") as handle:
            handle.write(text.encode("utf-8"))
        os.rename(partial, target)
    except (IOError, OSError) as failure:
        sys.stderr.write("npu-job: warning: could not write %s: %s\\n" % (out, failure))


def main():
    bundle = os.path.dirname(__file__)
    args = sys.argv[1:]
    command = args[0] if args and args[0] in FLOORS else "version"
    floor = FLOORS[command]
    if sys.version_info[:2] < floor:
        reason = "%s: Python %s (%s) is older than %d.%d, %s" % (
            bundle, sys.version.split()[0], sys.executable, floor[0], floor[1], ADVICE[command])
        if command != "bootstrap":
            error(reason)
            return FLOOR_EXIT
        error(reason + "; keeping the scheduler order")
        fall_back(args[1:], reason)
        strict = "--strict" in args[1:]
        strict = strict or os.environ.get(STRICT_ENV, "").strip().lower() in TRUE_WORDS
        return FLOOR_EXIT if strict else 0
    recorded, failed = load(bundle)
    if failed:
        return failed
    from npu_job.pod.bundled import main as run
    return run(bundle, recorded)


def load(bundle):
    '''(digest, None) with the bundle's modules importable once its bytes match their digest, else
    (None, exit code) after one line.'''
    try:
        with open(bundle, "rb") as handle:
            data = handle.read()
    except (IOError, OSError) as failure:
        error("%s: not a readable npu-job bundle (%s)" % (bundle, failure))
        return None, BUNDLE_EXIT
    recorded, computed = file_digest(data)
    if recorded != computed:
        error("%s: altered: its bytes have digest %s, the bundle records %s" % (
            bundle, computed[:SHORT], (recorded or "none")[:SHORT]))
        sys.stderr.write("npu-job: TIP: {tip}\\n")
        return None, BUNDLE_EXIT
    try:
        install(bundle, data)
    except Exception as failure:
        error("%s: altered: its sources do not inflate (%s)" % (bundle, failure))
        sys.stderr.write("npu-job: TIP: {tip}\\n")
        return None, BUNDLE_EXIT
    return recorded, None


if __name__ == "__main__":
    sys.exit(main())
"""


def _main_entry(version: str) -> str:
    """``__main__.py`` of a bundle of ``version``."""
    from npu_job.podfacts import (
        ENV_FILE,
        MASTER_FILE,
        NODE_REPORT_FILE,
        OUTPUT_DIR,
        OUTPUT_DIR_ENV,
        RANK_FILE,
        RANK_TABLE_COPY,
        ROUTE_PLAN_FILE,
        STRICT_ENV,
    )

    return _MAIN.format(
        version=version,
        floors=FLOORS,
        advice=FLOOR_ADVICE,
        floor_exit=FLOOR_EXIT,
        bundle_exit=BundleError.exit_code,
        output_dir=OUTPUT_DIR,
        output_dir_env=OUTPUT_DIR_ENV,
        strict_env=STRICT_ENV,
        true_words=tuple(TRUE_WORDS),
        route_plan_file=ROUTE_PLAN_FILE,
        # RANK_AFTER_ACC first: never a rank without its master (as the bootstrap's fallback);
        # and no node report of an earlier run (npu-run then reports what its flags say)
        plan_files=(RANK_FILE, MASTER_FILE, ENV_FILE, RANK_TABLE_COPY, NODE_REPORT_FILE),
        short=podfacts.SHOWN_DIGEST,
        digest_rule=_DIGEST_RULE,
        sources_rule=_SOURCES_RULE,
        tip=ALTERED_TIP,
    )


def _prologue(version: str, digest: str) -> bytes:
    loader = _LOADER.format(
        unreadable=UNREADABLE,
        bundle_exit=BundleError.exit_code,
        main_entry=MAIN_ENTRY,
        tip=ALTERED_TIP,
    )
    return _PROLOGUE.format(
        version=version,
        digest_field=DIGEST_FIELD,
        digest=digest,
        name=BUNDLE_NAME,
        loader=loader,
        unreadable=UNREADABLE,
        bundle_exit=BundleError.exit_code,
    ).encode("ascii")


@dataclass(frozen=True)
class Bundle:
    """A built bundle: its bytes and what identifies it."""

    data: bytes
    digest: str  # file_digest: every byte of the file (what the pod's first log line shows)
    version: str
    entries: int  # the modules it holds, __main__.py among them
    source_bytes: int  # the sources before blanking, for the size report

    @property
    def short_digest(self) -> str:
        return short_digest(self.digest)


def build(files: Iterable[Tuple[str, str]], version: str = __version__) -> Bundle:
    """The bundle of ``files`` (archive name, Python source): prologue, then a zip archive."""
    files = list(files)
    stripped = sorted((name, strip_prose(text).encode("utf-8")) for name, text in files)
    source_bytes = sum(len(text.encode("utf-8")) for _, text in files)
    stream = sources_stream(stripped)
    chunks = [
        (f"{CHUNK_PREFIX}{number:02d}", stream[at : at + CHUNK_BYTES])
        for number, at in enumerate(range(0, len(stream), CHUNK_BYTES))
    ]
    main = (MAIN_ENTRY, _main_entry(version).encode("utf-8"))
    entries = [main, (PACKAGE_ENTRY, _PACKAGE_STUB.encode("utf-8")), *chunks]
    sentinel = zip_archive([(MAIN_ENTRY, _CUT_SHORT.format(unreadable=UNREADABLE).encode())])
    stored = {PACKAGE_ENTRY, *(name for name, _ in chunks)}  # zipimport may lack zlib
    archive = zip_archive(entries, sentinel=sentinel, stored=stored)
    unsigned = _prologue(version, "0" * DIGEST_HEX) + archive
    _, digest = file_digest(unsigned)
    data = _prologue(version, digest[len(DIGEST_PREFIX) :]) + archive
    return Bundle(data, digest, version, len(stripped) + 1, source_bytes)


# A sentinel's __main__.py: what Python runs of a bundle cut short, when it finds the sentinel.
_CUT_SHORT = """\
import sys
sys.stderr.write("npu-job: error: %s: {unreadable}\\n" % sys.argv[0])
sys.exit(10)
"""


def pod_side_files(kinds: Optional[Iterable[str]] = None) -> List[Tuple[str, str]]:
    """(archive name, source) of every module the bundle holds, read from this installation.

    ``kinds``: the job kinds whose records it holds (with the default kind, which the pod side
    falls back to, and the kind modules those import); None: every kind. A job's bundle holds
    its own kind's alone: each kind's module costs the ConfigMap's annotations room.
    """
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
            name = f"{prefix}/{path.relative_to(root).as_posix()}"
            if "__pycache__" not in path.parts:
                files.append((name, path))
    read = [(name, path.read_text(encoding="utf-8")) for name, path in files]
    return read if kinds is None else _with_kinds(read, kinds)


_KINDS_PREFIX = "npu_job/kinds/"
# a kind module's imports of its siblings: "from .jobset import ..." or "from . import a, b"
_SIBLING_IMPORT = re.compile(r"^\s*from \.(?:(\w+) import|\s+import ([\w, ]+))", re.M)


def _with_kinds(files: List[Tuple[str, str]], kinds: Iterable[str]) -> List[Tuple[str, str]]:
    """``files`` holding of ``npu_job/kinds/`` only the registry, the modules of ``kinds`` and
    the default kind, and what those import of their siblings."""
    from npu_job.kinds import DEFAULT, KIND_NAMES

    source = {
        name[len(_KINDS_PREFIX) : -3]: text
        for name, text in files
        if name.startswith(_KINDS_PREFIX)
    }
    wanted = {DEFAULT, *kinds}
    pending = list(wanted)
    while pending:
        for match in _SIBLING_IMPORT.finditer(source.get(pending.pop(), "")):
            for sibling in (match.group(1) or match.group(2)).replace(" ", "").split(","):
                if sibling in source and sibling not in wanted:
                    wanted.add(sibling)
                    pending.append(sibling)
    left_out = set(KIND_NAMES) - wanted
    return [
        (name, text)
        for name, text in files
        if not name.startswith(_KINDS_PREFIX) or name[len(_KINDS_PREFIX) : -3] not in left_out
    ]


def installed_bundle(kinds: Optional[Iterable[str]] = None) -> Bundle:
    """The bundle of this installation's pod side, with the records of ``kinds`` (None: every
    kind; :func:`pod_side_files`), built once per process for each."""
    return _bundle_of(None if kinds is None else tuple(sorted(set(kinds))))


@functools.lru_cache(maxsize=None)
def _bundle_of(kinds: Optional[Tuple[str, ...]]) -> Bundle:
    return build(pod_side_files(kinds))
