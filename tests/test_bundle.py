"""The job's bundle of the pod side (``npu-job.pyz``): what render ships and pods run.

It is reproducible (the same sources give the same bytes), small enough for ``kubectl apply``,
self-contained (every ``npu_job`` module a bundled module imports is in it), written for the
oldest Pythons the pod side promises (3.7 for the bootstrap and the core, 3.8 for npu-run, checked
statically by vermin and by running it), and a pod runs it as it is: from ``bootstrap.sh`` or
directly, on CPython 3.7, 3.8, 3.9, 3.12 and 3.13 where pyenv has them, with the same outputs
byte for byte as this interpreter's. A missing, truncated or altered bundle is one line: its
digest covers every byte of the file, and a bit flipped in any part of it is caught. On an
interpreter below the floor (CPython 3.6 and 2.7 from pyenv, as an image's python3) the bootstrap
is one line, a failed route plan and the scheduler order; npu-run and train.sh exit 9.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import yaml
from npu_job.demo.images import find_interpreter
from npu_job.render.render import (
    ANNOTATIONS_LIMIT,
    APPLY_WARN_SHARE,
    annotations_after_apply,
    render,
)
from npu_job.render.spec import JobSpec, validate
from npu_job.render.values import SpecInput, load_yaml_values, merge_values

from npu_job import __version__
from npu_job.bundle import (
    BUNDLE_NAME,
    CHUNK_PREFIX,
    DIGEST_PREFIX,
    FLOOR_EXIT,
    FLOORS,
    MAIN_ENTRY,
    PACKAGE_ENTRY,
    UNREADABLE,
    Bundle,
    build,
    bundled_sources,
    file_digest,
    installed_bundle,
    pod_side_files,
    sources_stream,
    strip_prose,
    zip_archive,
)
from npu_job.bundlezip import FIXED_DATE
from npu_job.errors import BundleError, MissingExtraError
from npu_job.pod import bundled
from tests.bootstrap.documents import write_cce_job
from tests.test_layers import import_statements

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP_SH = ROOT / "scripts" / "bootstrap.sh"
#: the Pythons CI runs the bootstrap from the bundle on: the floor, 3.7, and four after it
FLOOR_PYTHONS = [(3, 7), (3, 8), (3, 9), (3, 12), (3, 13)]
#: vermin (the test extra), beside this interpreter as pip installs console scripts
VERMIN = str(Path(sys.executable).parent / "vermin")


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return installed_bundle()


@pytest.fixture
def bundle_file(tmp_path: Path, bundle: Bundle) -> Path:
    path = tmp_path / "scripts" / BUNDLE_NAME
    path.parent.mkdir()
    path.write_bytes(bundle.data)
    return path


def _archive(data: bytes) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(data))


# --- reproducible and small -----------------------------------------------------------------------


def test_the_same_sources_give_the_same_bytes_in_any_order(bundle: Bundle) -> None:
    files = pod_side_files()
    once = build(files).data
    assert build(files).data == once and build(list(reversed(files))).data == once
    infos = _archive(bundle.data).infolist()
    chunks = [info for info in infos if info.filename.startswith(CHUNK_PREFIX)]
    ahead = [MAIN_ENTRY, PACKAGE_ENTRY]
    assert [info.filename for info in infos] == [*ahead, *(info.filename for info in chunks)]
    assert [info.filename for info in chunks] == [
        f"{CHUNK_PREFIX}{n:02d}" for n in range(len(chunks))
    ]
    assert {info.compress_type for info in chunks} == {zipfile.ZIP_STORED}, "one zlib stream"
    assert {info.date_time for info in infos} == {FIXED_DATE}
    names = list(bundled_sources(bundle.data))
    assert names == sorted(names) and len(names) == bundle.entries - 1
    assert not [name for name in names if not name.endswith(".py")], "sources only, no .pyc"


def test_the_digest_is_of_every_byte_of_the_file_but_its_own_field(bundle: Bundle) -> None:
    recorded, computed = file_digest(bundle.data)
    assert recorded == computed == bundle.digest
    assert bundle.data.splitlines()[1].startswith(f"# npu-job {__version__}, bundle ".encode())
    assert bundle.digest.encode() in bundle.data.splitlines()[1]
    field = bundle.data.index(bundle.digest[len(DIGEST_PREFIX) :].encode())
    for position in (0, field - 1, field, field + 63, field + 64, len(bundle.data) - 1):
        changed = bytearray(bundle.data)
        changed[position] ^= 0x01
        recorded, computed = file_digest(bytes(changed))
        assert recorded != computed, position


def test_every_example_jobs_objects_leave_kubectl_apply_a_margin_under_the_annotation_limit(
    bundle: Bundle,
) -> None:
    """Client-side ``kubectl apply`` keeps each object as JSON in an annotation, and the API server
    refuses an object whose annotations pass 262,144 bytes: the scripts ConfigMap, with the
    bundle in base64, is the big one. The margin is the share render warns at (10% of the limit),
    so this fails before a user of an example job sees that warning. The size is kubectl's own
    (tests/render/test_apply_size.py checks it against kubectl where kubectl is installed)."""
    sizes = {}
    for example in sorted((ROOT / "examples").glob("job-*.yaml")):
        values = load_yaml_values(example.read_text(), example.name)
        spec = validate(merge_values([SpecInput(example.name, values=values)]))
        shipped = installed_bundle((spec.kind,))  # a job's bundle holds its own kind's record
        assert len(shipped.data) < len(bundle.data)
        for document in yaml.safe_load_all(render(spec).stream()):
            sizes[f"{example.name}: {document['kind']}"] = annotations_after_apply(document)
            if BUNDLE_NAME in (document.get("binaryData") or {}):
                assert base64.b64decode(document["binaryData"][BUNDLE_NAME]) == shipped.data
    largest = max(sizes, key=sizes.__getitem__)
    assert "ConfigMap" in largest, sizes
    assert sizes[largest] <= ANNOTATIONS_LIMIT * APPLY_WARN_SHARE, (largest, sizes[largest])


def _stated(page: str, pattern: str) -> int:
    found = re.search(pattern, (ROOT / "docs" / page).read_text(encoding="utf-8"))
    assert found, f"docs/{page} no longer states it as {pattern!r}"
    return int(found.group(1).replace(",", ""))


def test_the_docs_state_the_bundles_size_and_its_configmaps_annotations_as_built(
    bundle: Bundle,
) -> None:
    """Within 2%: a change of the pod side moves both; past that, measure again (the commands
    are beside the figures)."""
    stated = _stated("bootstrap.md", r"\(([\d,]+) bytes, `npu-job bundle\s+-o npu-job.pyz`")
    kib = _stated("bootstrap.md", r"([\d]+)\.\d KiB \([\d,]+ bytes, `npu-job bundle")
    assert kib == int(stated / 1024 * 10 + 0.5) // 10, "the KiB beside the bytes"
    assert abs(stated - len(bundle.data)) <= 0.02 * len(bundle.data), (stated, len(bundle.data))
    source = "examples/job-npu-6node.yaml"
    values = load_yaml_values((ROOT / source).read_text(), source)
    rendered = render(validate(merge_values([SpecInput(source, values=values)])))
    configmap = next(yaml.safe_load_all(rendered.stream()))
    size = annotations_after_apply(configmap)
    stated = _stated("render.md", r"comes close: ([\d,]+) bytes of annotations for\s+`" + source)
    assert abs(stated - size) <= 0.02 * size, (stated, size)


# --- the sources as shipped ---------------------------------------------------------------------------

TRICKY = """\
\"\"\"Module doc.\"\"\"  # a comment after it
import os  # why


def one_line(): \"\"\"doc on the def's line\"\"\"; return "é"  # é before


class Thing:
    \"\"\"Doc
    over lines, with é and 'quotes'.\"\"\"

    value = "# not a comment"

    async def run(self) -> None:
        \"\"\"Doc.\"\"\"
        x = "kept: not a docstring"  # noqa
        return None
"""


def _shape(source: str) -> List[Tuple[str, Optional[int]]]:
    """Every node of ``source``'s syntax tree and its line, docstrings reduced to ``""``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[0].value.value = ""
    return [
        (ast.dump(node, include_attributes=False), getattr(node, "lineno", None))
        for node in ast.walk(tree)
        if not isinstance(node, (ast.expr_context, ast.Constant))
    ]


@pytest.mark.parametrize("name", ["tricky"] + [name for name, _ in pod_side_files()])
def test_blanking_prose_keeps_every_statement_on_its_line(name: str) -> None:
    source = TRICKY if name == "tricky" else dict(pod_side_files())[name]
    stripped = strip_prose(source)
    assert _shape(stripped) == _shape(source)
    assert stripped.count("\n") == source.count("\n")
    tokens = tokenize.generate_tokens(io.StringIO(stripped).readline)
    assert [token.string for token in tokens if token.type == tokenize.COMMENT] == []


def test_every_npu_job_module_a_bundled_module_imports_is_bundled(bundle: Bundle) -> None:
    sources = bundled_sources(bundle.data)
    names = set(sources)
    modules = {name[: -len(".py")].replace("/", ".").replace(".__init__", "") for name in names}
    missing = []
    for name in sorted(names):
        package = name.rsplit("/", 1)[0].replace("/", ".")
        if name.endswith("__init__.py"):
            package = name[: -len("/__init__.py")].replace("/", ".")
        for names_brought, _ in import_statements(ast.parse(sources[name]), package):
            # ``from X import a``: X.a where it is a module, else X itself
            targets = [t for t in names_brought[1:] if t in modules] or names_brought[:1]
            for target in targets:
                if target.split(".")[0] == "npu_job" and target not in modules:
                    missing.append(f"{name} imports {target}")
    assert missing == []


def _vermin(target: str, paths: Sequence[Path]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            VERMIN,
            "--no-tips",
            "--violations",
            f"-t={target}-",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_floor_check_catches_what_is_newer_than_the_floor(tmp_path: Path) -> None:
    newer = tmp_path / "newer.py"
    newer.write_text("import functools\nif (n := 1):\n    functools.cached_property\n")
    done = _vermin("3.7", [newer])
    assert done.returncode != 0 and "3.8" in done.stdout, done.stdout


def test_the_bundle_holds_no_syntax_or_stdlib_use_newer_than_its_floors(
    tmp_path: Path, bundle: Bundle
) -> None:
    """The bootstrap and the core: Python 3.7 (the platform's routing images); npu-run: 3.8 (the
    oldest Python of torch 2.1). The sources as shipped, so a ``# novermin`` comment (a line that
    a newer interpreter alone reaches, or a type checker) is kept out of the bundle but seen here."""
    shipped = bundled_sources(bundle.data)
    floors: Dict[str, List[Path]] = {"3.7": [], "3.8": []}
    for name, source in pod_side_files():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        floors["3.8" if name.startswith("npu_job/launcher/") else "3.7"].append(path)
        assert name in shipped
    for target, paths in floors.items():
        done = _vermin(target, paths)
        assert done.returncode == 0, done.stdout


# --- run as a pod runs it -------------------------------------------------------------------------


def _pod_env(tmp_path: Path, **extra: str) -> Dict[str, str]:
    """A pod's environment: no npu-job variables, nothing on PYTHONPATH, no user site-packages."""
    env = {"PATH": os.environ["PATH"], "PYTHONNOUSERSITE": "1", "HOME": str(tmp_path)}
    env.update(extra)
    return env


def _job(tmp_path: Path) -> List[str]:
    table, _, _ = write_cce_job(tmp_path / "config", 6, 2)
    host = table.servers[2].server_id
    return ["--rank-table", str(tmp_path / "config"), "--host-ip", host, "--pod-index", "2"]


def _outputs(directory: Path) -> Dict[str, bytes]:
    return {
        path.name: path.read_bytes().replace(str(directory).encode(), b"OUT")
        for path in sorted(directory.iterdir())
    }


def test_the_bootstrap_from_the_bundle_gives_the_same_files_on_every_floor_python(
    tmp_path: Path, bundle: Bundle, bundle_file: Path
) -> None:
    flags = _job(tmp_path)
    reference = tmp_path / "reference"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "npu_job.bootstrap",
            *flags,
            "--strict",
            "--output-dir",
            str(reference),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    expected = _outputs(reference)
    assert "RANK_AFTER_ACC" in expected
    ran = []
    for version in FLOOR_PYTHONS:
        python = find_interpreter(version)
        if python is None:
            continue
        out = tmp_path / f"py{version[0]}{version[1]}"
        done = subprocess.run(
            ["bash", str(BOOTSTRAP_SH.resolve()), *flags, "--strict", "--output-dir", str(out)],
            env=_pod_env(tmp_path, NPU_JOB_PYTHON=python, NPU_JOB_BUNDLE=str(bundle_file)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{python}: {done.stderr}"
        first = done.stderr.splitlines()[0]
        assert first.startswith(f"npu-job: running {__version__} from bundle {bundle.short_digest}")
        assert f"on Python {version[0]}.{version[1]}." in first
        assert _outputs(out) == expected, python
        ran.append(version)
    missing = [version for version in FLOOR_PYTHONS if version not in ran]
    if missing and os.environ.get(
        "CI"
    ):  # CI's machines carry them all (pyenv): none may go untried
        pytest.fail(f"CI lacks the Pythons {missing} the bundle must run on")
    if (3, 7) not in ran:
        pytest.skip(f"no CPython 3.7 on this machine (ran on {ran})")


def test_the_bundle_wins_over_the_npu_job_this_python_has_installed(
    tmp_path: Path, bundle: Bundle, bundle_file: Path
) -> None:
    """This interpreter imports npu_job from the source tree; run from the bundle it must not."""
    done = subprocess.run(
        [sys.executable, str(bundle_file), "version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.split() == ["npu-job", __version__, bundle.digest]
    bootstrap = subprocess.run(
        ["sh", str(bundle_file), *_job(tmp_path), "--output-dir", str(tmp_path / "out")],
        env=dict(os.environ, NPU_JOB_PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bootstrap.returncode == 0, bootstrap.stderr
    assert f"from bundle {bundle.short_digest} ({bundle_file})" in bootstrap.stderr
    # a copy of npu_job from elsewhere is refused, whatever put it first on sys.path
    with pytest.raises(BundleError, match=r"npu_job was imported from .*, not from the bundle"):
        bundled.check(str(bundle_file))


def _three_node_spec() -> JobSpec:
    from npu_job.render.values import SpecInput, merge_values

    values = {"name": "demo", "image": "x", "script": "train.py", "nodes": 3}
    return validate(merge_values([SpecInput("job.yaml", values=values)]))


def _run_train_sh(
    tmp_path: Path, env: Dict[str, str], bundle_file: Path
) -> subprocess.CompletedProcess:
    """A 3-node job's train.sh, run as pod 0 runs it with the bundle at ``bundle_file``."""
    train_sh = tmp_path / "train.sh"
    train_sh.write_text(dict(render(_three_node_spec()).scripts)["train.sh"])
    pod = {"NPU_JOB_BUNDLE": str(bundle_file), "VC_TASK_INDEX": "0"}
    pod.update(MA_VJ_NAME="demo", MA_TASK_NAME="worker")
    return subprocess.run(
        ["bash", str(train_sh)], env={**env, **pod}, capture_output=True, text=True, timeout=60
    )


def _truncated(bundle_file: Path) -> Path:
    bundle_file.write_bytes(bundle_file.read_bytes()[: len(bundle_file.read_bytes()) // 2])
    return bundle_file


def _altered(bundle_file: Path) -> Path:
    """The planner's source changed in the bundle's stream, every zip field made to match."""
    data = bundle_file.read_bytes()
    sources = bundled_sources(data)
    sources["npu_job/bootstrap/planner.py"] += b"\nNODES_UNDER_ONE_SWITCH = 0\n"
    stream = sources_stream(sorted(sources.items()))
    kept = [(name, _archive(data).read(name)) for name in (MAIN_ENTRY, PACKAGE_ENTRY)]
    entries = [*kept, (f"{CHUNK_PREFIX}00", stream)]
    archive = zip_archive(entries, stored={PACKAGE_ENTRY, f"{CHUNK_PREFIX}00"})
    bundle_file.write_bytes(data[: data.index(b"PK\x03\x04")] + archive)
    assert bundled_sources(bundle_file.read_bytes()) == sources
    return bundle_file


def _missing(bundle_file: Path) -> Path:
    bundle_file.unlink()
    return bundle_file


DAMAGE = {
    "missing": (_missing, "no readable npu-job bundle"),
    "truncated": (_truncated, "not a readable npu-job bundle"),
    "altered": (_altered, "altered: its bytes have digest sha256:"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
def test_a_bad_bundle_is_one_line_and_the_scheduler_order(
    tmp_path: Path, bundle_file: Path, damage: str, strict: bool
) -> None:
    spoil, message = DAMAGE[damage]
    spoil(bundle_file)
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(BOOTSTRAP_SH), *_job(tmp_path), "--output-dir", str(out)]
        + (["--strict"] if strict else []),
        env=_pod_env(tmp_path, NPU_JOB_PYTHON=sys.executable, NPU_JOB_BUNDLE=str(bundle_file)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    errors = [line for line in done.stderr.splitlines() if not line.startswith("npu-job: TIP: ")]
    assert len(errors) == 1 and errors[0].startswith("npu-job: error: "), done.stderr
    assert message in errors[0] and "Traceback" not in done.stderr
    assert done.returncode == (BundleError.exit_code if strict else 0)
    assert not (out / "RANK_AFTER_ACC").exists()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_train_sh_stops_with_one_line_on_a_bad_bundle(
    tmp_path: Path, bundle_file: Path, damage: str
) -> None:
    spoil, message = DAMAGE[damage]
    spoil(bundle_file)
    done = _run_train_sh(tmp_path, _pod_env(tmp_path, NPU_JOB_PYTHON=sys.executable), bundle_file)
    errors = [line for line in done.stderr.splitlines() if line.startswith("npu-job: error: ")]
    assert done.returncode == BundleError.exit_code, done.stderr
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in done.stderr


END_OF_ARCHIVE = b"PK\x05\x06"
#: zipimport's reach back from a file's end for an archive's end (its longest comment and the end
#: record itself), CPython 3.8 to 3.12; 3.13 reaches 76 bytes further
ZIPIMPORT_REACH = 65535 + 22


def _sentinel_ends(data: bytes) -> List[int]:
    """Where each sentinel's end-of-archive record starts (the bundle's own is the last)."""
    found, at = [], data.find(END_OF_ARCHIVE)
    while at >= 0:
        found.append(at)
        at = data.find(END_OF_ARCHIVE, at + 1)
    assert found[-1] == len(data) - 22
    return found[:-1]


def _regions(data: bytes) -> Dict[str, Tuple[int, int]]:
    """Where each part of a bundle lies: (start, end) of the prologue's comment, its loader, each
    entry's stored bytes and the archive's directory."""
    loader = data.index(b"-c '") + len(b"-c '")
    regions = {
        "prologue comment": (data.index(b"# npu-job"), data.index(b"\n", 12)),
        "prologue loader": (loader, data.index(b"'", loader)),
    }
    archive = _archive(data)
    for info in archive.infolist():
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        regions[info.filename] = (start, start + info.compress_size)
    end_of_entries = max(end for _, end in regions.values())
    regions["directory"] = (end_of_entries, len(data))
    for number, at in enumerate(_sentinel_ends(data), 1):
        regions[f"sentinel {number}"] = (at - 100, at)
    return regions


def _flipped(data: bytes, region: Tuple[int, int], within: str = "") -> bytes:
    """``data`` with one bit flipped in the middle of ``region`` (in a letter of it: ``within``)."""
    start, end = region
    position = (start + end) // 2
    if within:  # a letter of a message, so that the code around it still runs
        position = data.index(within.encode(), start, end) + 1
    changed = bytearray(data)
    changed[position] ^= 0x01
    return bytes(changed)


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if not line.startswith("npu-job: TIP: ")]
    assert len(errors) == 1 and errors[0].startswith("npu-job: error: "), stderr
    assert "Traceback" not in stderr
    return errors[0]


REGIONS = list(_regions(installed_bundle().data))


@pytest.mark.parametrize("region", REGIONS)
def test_a_byte_flipped_anywhere_in_the_bundle_is_one_line_and_exit_10(
    tmp_path: Path, bundle: Bundle, bundle_file: Path, region: str
) -> None:
    """The digest covers every byte that runs: the prologue (its shell and its loader), the
    entry point, every entry and the archive's directory. Run as the pod runs it (sh) and, but for
    the entry point (Python itself then decompresses what it runs), as python3 FILE."""
    where = _regions(bundle.data)[region]
    within = {"prologue comment": "the pod side", "prologue loader": "altered"}.get(region, "")
    bundle_file.write_bytes(_flipped(bundle.data, where, within))
    out = tmp_path / "out"
    ways = [["sh", str(bundle_file)]]
    if region != MAIN_ENTRY:
        ways.append([sys.executable, str(bundle_file), "bootstrap"])
    for way in ways:
        done = subprocess.run(
            [*way, *_job(tmp_path), "--output-dir", str(out)],
            env=_pod_env(tmp_path, NPU_JOB_PYTHON=sys.executable),
            capture_output=True,
            text=True,
            timeout=60,
        )
        line = _one_error_line(done.stderr)
        assert done.returncode == BundleError.exit_code, (way, done.stderr)
        assert "altered" in line or UNREADABLE in line, line
        assert not out.exists()


def test_a_bundle_cut_anywhere_past_its_first_sentinel_ends_within_reach_of_a_whole_one(
    bundle: Bundle,
) -> None:
    ends = _sentinel_ends(bundle.data)
    assert len(ends) >= 2 and ends[0] < bundle.data.index(b"PK\x03\x04", ends[0]) < 2048
    for at in ends:
        sentinel = _archive(bundle.data[: at + 22])
        assert sentinel.namelist() == [MAIN_ENTRY] and b"exit(10)" in sentinel.read(MAIN_ENTRY)
    # the worst cut: just before the next sentinel's record is whole, or the archive's own
    for previous, following in zip(ends, [*ends[1:], len(bundle.data) - 22]):
        assert following + 21 - previous <= ZIPIMPORT_REACH


def _cuts(data: bytes) -> List[int]:
    """Lengths to cut a bundle to: past its first sentinel, at and next to every end-of-archive
    record, none inside one."""
    ends = _sentinel_ends(data) + [len(data) - 22]
    cuts = list(range(data.index(b"PK\x03\x04") + 2048, len(data), 20_000))
    cuts += [end + 22 for end in ends[:-1]] + [end - 1 for end in ends]
    cuts = sorted(
        cut for cut in cuts if cut >= ends[0] + 22 and not any(end < cut < end + 22 for end in ends)
    )
    assert len(cuts) >= 10, cuts
    return cuts


def test_a_bundle_cut_short_is_one_line_and_exit_10_from_sh_and_from_python3_since_3_8(
    tmp_path: Path, bundle: Bundle, bundle_file: Path
) -> None:
    """python3 FILE finds no archive at the end of a file cut short; CPython 3.8 and later then
    look back for one and run the sentinel they find. CPython 3.7 looks no further and compiles
    the whole file as a script, so no code of it can run: its error shows the line's text."""
    pythons = {version: find_interpreter(version) for version in [(3, 7), (3, 8)]}
    pythons[sys.version_info[:2]] = sys.executable
    ends = _sentinel_ends(bundle.data)
    for cut in _cuts(bundle.data):
        bundle_file.write_bytes(bundle.data[:cut])
        for version, python in sorted(item for item in pythons.items() if item[1]):
            from_sh = subprocess.run(
                ["sh", str(bundle_file), "version"],
                env=_pod_env(tmp_path, NPU_JOB_PYTHON=python),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert from_sh.returncode == BundleError.exit_code, (cut, python, from_sh.stderr)
            line = _one_error_line(from_sh.stderr)
            assert line == f"npu-job: error: {bundle_file}: {UNREADABLE}", (cut, python)
            from_python = subprocess.run(
                [python, str(bundle_file), "version"], capture_output=True, text=True, timeout=60
            )
            if version >= (3, 8) or cut - 22 in ends:  # 3.7: the file's last 22 bytes
                assert from_python.returncode == BundleError.exit_code, (cut, python)
                assert _one_error_line(from_python.stderr) == line, (cut, python)
            else:
                assert from_python.returncode == 1 and "Traceback" not in from_python.stderr
                assert f'"npu-job: error: {UNREADABLE}' in from_python.stderr.splitlines()[1]


# --- an interpreter below the floor -------------------------------------------------------------

#: Interpreters older than every floor, which must get the one line: 3.6 parses most of the pod
#: side but not its ``from __future__ import annotations``; 2.7 parses none of it.
OLD_PYTHONS = [(3, 6), (2, 7)]


def _old_python(version: Tuple[int, int], tmp_path: Path) -> Path:
    """A directory whose ``python3`` is CPython ``version`` (skips where there is none)."""
    found = find_interpreter(version)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI lacks CPython {version}, which the bundle must refuse in one line")
        pytest.skip(f"no CPython {version} on this machine")
    directory = tmp_path / "image-bin"
    directory.mkdir(exist_ok=True)
    (directory / "python3").symlink_to(found)
    return directory


def _image_env(tmp_path: Path, bin_dir: Path, **extra: str) -> Dict[str, str]:
    """A pod whose image's python3 is the old one."""
    return _pod_env(tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra)


@pytest.mark.parametrize("version", OLD_PYTHONS, ids=["py36", "py27"])
@pytest.mark.parametrize(
    "way", ["bash npu-job.pyz", "python3 npu-job.pyz bootstrap", "bash bootstrap.sh"]
)
@pytest.mark.parametrize("strict", ["", "--strict", "NPU_JOB_STRICT=yes"])
def test_the_bootstrap_on_a_python_below_its_floor_is_one_line_a_failed_plan_and_exit_0(
    tmp_path: Path, bundle_file: Path, version: Tuple[int, int], way: str, strict: str
) -> None:
    from npu_job.bootstrap.writers import route_plan_document

    bin_dir = _old_python(version, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "RANK_AFTER_ACC").write_text("5")  # a previous run's, which must not survive
    (out / "MASTER_INDEX").write_text("1")
    (out / "npu_job_node.json").write_text('{"version": 1, "pod_index": 5}')  # nor its report
    command = {
        "bash npu-job.pyz": ["bash", str(bundle_file)],
        "python3 npu-job.pyz bootstrap": ["python3", str(bundle_file), "bootstrap"],
        "bash bootstrap.sh": ["bash", str(BOOTSTRAP_SH)],
    }[way]
    extra = {"NPU_JOB_BUNDLE": str(bundle_file)} if way == "bash bootstrap.sh" else {}
    if strict.startswith("NPU_JOB_STRICT="):
        extra["NPU_JOB_STRICT"] = strict.split("=", 1)[1]
    done = subprocess.run(
        [*command, *_job(tmp_path), "--output-dir", str(out)]
        + (["--strict"] if strict == "--strict" else []),
        env=_image_env(tmp_path, bin_dir, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = _one_error_line(done.stderr)
    found = ".".join(map(str, version))
    assert f"Python {found}." in line and "is older than 3.7, the bootstrap's oldest" in line
    assert line.endswith("; keeping the scheduler order"), line
    assert done.returncode == (FLOOR_EXIT if strict else 0), done.stderr
    assert sorted(path.name for path in out.iterdir()) == ["route_plan.json"]
    plan = json.loads((out / "route_plan.json").read_text())
    reason = line[len("npu-job: error: ") : -len("; keeping the scheduler order")]
    assert plan == json.loads(json.dumps(route_plan_document(None, error=reason)))


@pytest.mark.parametrize("version", OLD_PYTHONS, ids=["py36", "py27"])
def test_npu_run_and_version_on_a_python_below_their_floor_are_one_line_and_exit_9(
    tmp_path: Path, bundle_file: Path, version: Tuple[int, int]
) -> None:
    bin_dir = _old_python(version, tmp_path)
    for argv in (["run", "--nnodes=1", "train.py"], ["version"]):
        floor = FLOORS[argv[0]]
        for way in (["bash", str(bundle_file)], ["python3", str(bundle_file)]):
            done = subprocess.run(
                [*way, *argv],
                env=_image_env(tmp_path, bin_dir),
                capture_output=True,
                text=True,
                timeout=60,
            )
            line = _one_error_line(done.stderr)
            assert f"is older than {floor[0]}.{floor[1]}" in line, line
            assert done.returncode == MissingExtraError.exit_code == FLOOR_EXIT, done.stderr


@pytest.mark.parametrize("version", OLD_PYTHONS, ids=["py36", "py27"])
def test_train_sh_on_a_python_below_npu_runs_floor_stops_with_one_line_and_exit_9(
    tmp_path: Path, bundle_file: Path, version: Tuple[int, int]
) -> None:
    bin_dir = _old_python(version, tmp_path)
    done = _run_train_sh(tmp_path, _image_env(tmp_path, bin_dir), bundle_file)
    errors = [line for line in done.stderr.splitlines() if line.startswith("npu-job: error: ")]
    assert done.returncode == FLOOR_EXIT, done.stderr
    assert len(errors) == 1 and "is older than 3.8, npu-run's oldest" in errors[0], done.stderr
    assert "NPU_JOB_LAUNCHER_PYTHON" in errors[0] and "Traceback" not in done.stderr


# --- npu-job bundle ---------------------------------------------------------------------------------


def test_npu_job_bundle_writes_the_bundle_render_ships(tmp_path: Path, bundle: Bundle) -> None:
    target = tmp_path / "hosted" / "bootstrap.sh"
    done = subprocess.run(
        [sys.executable, "-m", "npu_job", "bundle", "-o", str(target), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {
        "version": __version__,
        "path": str(target),
        "digest": bundle.digest,
        "bytes": len(bundle.data),
        "entries": bundle.entries,
    }
    assert target.read_bytes() == bundle.data and os.access(target, os.X_OK)
    piped = subprocess.run(
        [sys.executable, "-m", "npu_job", "bundle", "-o", "-"], capture_output=True, timeout=60
    )
    assert piped.returncode == 0 and piped.stdout == bundle.data
    refused = subprocess.run(
        [sys.executable, "-m", "npu_job", "bundle", "-o", "-", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and not refused.stdout
    assert shutil.which("sh")
