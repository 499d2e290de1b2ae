"""The job's bundle of the pod side (``npu-job.pyz``): what render ships and pods run.

It is reproducible (the same sources give the same bytes), small enough for ``kubectl apply``,
self-contained (every ``npu_job`` module a bundled module imports is in it), written for the
oldest Pythons the pod side promises (3.7 for the bootstrap and the core, 3.8 for npu-run, checked
statically by vermin and by running it), and a pod runs it as it is: from ``bootstrap.sh`` or
directly, on CPython 3.7, 3.8, 3.9, 3.12 and 3.13 where pyenv has them, with the same outputs
byte for byte as this interpreter's. A missing, truncated or altered bundle is one line.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
from npu_job.demo.images import find_interpreter

from npu_job import __version__, bundled
from npu_job.bundle import (
    BUNDLE_NAME,
    FIXED_DATE,
    MAIN_ENTRY,
    Bundle,
    build,
    content_digest,
    installed_bundle,
    pod_side_files,
    strip_prose,
)
from npu_job.errors import BundleError
from tests.bootstrap.documents import write_cce_job
from tests.test_layers import import_statements

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP_SH = ROOT / "scripts" / "bootstrap.sh"
#: the Pythons CI runs the bootstrap from the bundle on (issue: 3.7, 3.8, 3.9, 3.12 and 3.13)
FLOOR_PYTHONS = [(3, 7), (3, 8), (3, 9), (3, 12), (3, 13)]
#: kubectl apply (client side) keeps the whole object as JSON in an annotation, and the API server
#: refuses annotations over 256 KiB: the ConfigMap must fit, with room for the scripts to grow
LAST_APPLIED_LIMIT = 256 * 1024
BUNDLE_SIZE_AIM = 300 * 1024
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
    names = [info.filename for info in infos]
    assert names == sorted(names) and MAIN_ENTRY in names
    assert {info.date_time for info in infos} == {FIXED_DATE}
    assert not [name for name in names if not name.endswith(".py")], "sources only, no .pyc"


def test_the_digest_names_what_the_bundle_holds_not_how_it_was_compressed(
    tmp_path: Path, bundle: Bundle
) -> None:
    archive = _archive(bundle.data)
    entries = [(info.filename, archive.read(info)) for info in archive.infolist()]
    stored = tmp_path / "stored.zip"
    with zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as copy:
        for name, data in reversed(entries):
            copy.writestr(name, data)
    assert bundled.archive_digest(str(stored)) == bundle.digest
    changed = [
        (name, data + b"\n" if name.endswith("planner.py") else data) for name, data in entries
    ]
    assert content_digest(changed) != bundle.digest
    assert bundle.digest in archive.read(MAIN_ENTRY).decode()


def test_the_bundle_and_its_configmap_fit_what_kubernetes_and_kubectl_take(bundle: Bundle) -> None:
    import yaml
    from npu_job.render.render import render
    from npu_job.render.spec import validate
    from npu_job.render.values import SpecInput, load_yaml_values, merge_values

    assert len(bundle.data) <= BUNDLE_SIZE_AIM
    source = "examples/job-npu-6node.yaml"
    values = load_yaml_values((ROOT / source).read_text(), source)
    rendered = render(validate(merge_values([SpecInput(source, values=values)])))
    configmap = next(yaml.safe_load_all(rendered.stream()))
    assert base64.b64decode(configmap["binaryData"][BUNDLE_NAME]) == bundle.data
    as_applied = json.dumps(configmap, separators=(",", ":"))
    assert len(as_applied) < LAST_APPLIED_LIMIT * 0.9, len(as_applied)


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
    archive = _archive(bundle.data)
    names = {info.filename for info in archive.infolist()}
    modules = {name[: -len(".py")].replace("/", ".").replace(".__init__", "") for name in names}
    missing = []
    for name in sorted(names):
        package = name.rsplit("/", 1)[0].replace("/", ".")
        if name.endswith("__init__.py"):
            package = name[: -len("/__init__.py")].replace("/", ".")
        for names_brought, _ in import_statements(ast.parse(archive.read(name)), package):
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
    archive = _archive(bundle.data)
    floors: Dict[str, List[Path]] = {"3.7": [], "3.8": []}
    for name, source in pod_side_files():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        floors["3.8" if name.startswith("npu_job/launcher/") else "3.7"].append(path)
        assert name in archive.namelist()
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
        bundled.check(str(bundle_file), bundle.digest)


def _truncated(bundle_file: Path) -> Path:
    bundle_file.write_bytes(bundle_file.read_bytes()[: len(bundle_file.read_bytes()) // 2])
    return bundle_file


def _altered(bundle_file: Path) -> Path:
    data = bundle_file.read_bytes()
    start = data.index(b"PK\x03\x04")
    source = _archive(data)
    copy = io.BytesIO()
    with zipfile.ZipFile(copy, "w", zipfile.ZIP_DEFLATED) as altered:
        for info in source.infolist():
            content = source.read(info)
            if info.filename == "npu_job/bootstrap/planner.py":
                content += b"\nNODES_UNDER_ONE_SWITCH = 0\n"
            altered.writestr(info, content)
    bundle_file.write_bytes(data[:start] + copy.getvalue())
    return bundle_file


def _missing(bundle_file: Path) -> Path:
    bundle_file.unlink()
    return bundle_file


DAMAGE = {
    "missing": (_missing, "no readable npu-job bundle"),
    "truncated": (_truncated, "not a readable npu-job bundle"),
    "altered": (_altered, "altered: its entries have digest sha256:"),
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
    from npu_job.render.render import render
    from npu_job.render.spec import validate
    from npu_job.render.values import SpecInput, merge_values

    spec = validate(
        merge_values(
            [
                SpecInput(
                    "job.yaml",
                    values={"name": "demo", "image": "x", "script": "train.py", "nodes": 3},
                )
            ]
        )
    )
    train_sh = tmp_path / "train.sh"
    train_sh.write_text(dict(render(spec).scripts)["train.sh"])
    spoil, message = DAMAGE[damage]
    spoil(bundle_file)
    done = subprocess.run(
        ["bash", str(train_sh)],
        env=_pod_env(
            tmp_path,
            NPU_JOB_PYTHON=sys.executable,
            NPU_JOB_BUNDLE=str(bundle_file),
            VC_TASK_INDEX="0",
            MA_VJ_NAME="demo",
            MA_TASK_NAME="worker",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("npu-job: error: ")]
    assert done.returncode == BundleError.exit_code, done.stderr
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in done.stderr


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
