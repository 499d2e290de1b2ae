"""No product file passes 600 lines: a module that long holds more than one idea, and splitting
it later, once everything leans on its insides, costs more than keeping it apart now.

Product files are what the installed packages hold (setup.cfg's packages, wherever
``package_dir`` maps them): their Python modules, render's templates and the pod's scripts.
tests/ and benchmarks/ are not product.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

from .test_layers import REPO, package_dirs

MAX_LINES = 600
PRODUCT_SUFFIXES = (".py", ".j2", ".sh")


def product_files() -> List[Path]:
    return sorted(
        path
        for folder in package_dirs().values()
        for path in folder.iterdir()
        if path.is_file() and path.name.endswith(PRODUCT_SUFFIXES)
    )


def too_long(paths: List[Path], limit: int = MAX_LINES) -> List[str]:
    """``path: N lines`` of each file of ``paths`` longer than ``limit`` lines."""
    found = []
    for path in paths:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            shown = path.relative_to(REPO) if REPO in path.parents else path
            found.append(f"{shown}: {lines} lines")
    return found


def test_the_product_files_include_every_part_and_the_templates():
    names = {str(path.relative_to(REPO)) for path in product_files()}
    for expected in (
        "launcher/run.py",
        "launcher/proxy/server.py",
        "bootstrap/ranktable.py",
        "render/render.py",
        "npu_job/bundle.py",
        "templates/train.sh.j2",
        "scripts/bootstrap.sh",
    ):
        assert expected in names, expected
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)


def test_a_file_past_the_bound_is_named(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES)
    long, short = tmp_path / "long.py", tmp_path / "short.py"
    assert len(too_long([long, short])) == 1 and too_long([short]) == []


def test_no_product_file_passes_600_lines():
    assert too_long(product_files()) == []
