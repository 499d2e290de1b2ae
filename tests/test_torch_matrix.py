"""The torch matrix's choice of tests (``noxfile.py``, docs/development.md "The torch matrix"):
the oldest and the newest release run every launcher test, and every test named for the releases
between them exists, so that a renamed test fails here and not as a matrix session that found
nothing to run. Read from the noxfile's source: nothing is installed or run.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _constant(name: str) -> Any:
    """The value of the noxfile's top-level assignment to ``name``."""
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py assigns no {name}")


def _release(version: str) -> tuple:
    return tuple(int(part) for part in version.split("."))


def test_the_oldest_and_the_newest_release_run_every_launcher_test():
    releases = sorted(_constant("MATRIX"), key=_release)
    assert sorted(_constant("EVERY_TEST"), key=_release) == [releases[0], releases[-1]]
    assert _constant("LAUNCHER_TESTS") == "tests/launcher"


def test_every_test_the_middle_releases_run_exists():
    for entry in _constant("RELEASE_DEPENDENT"):
        path, _, function = entry.partition("::")
        assert path.startswith("tests/launcher/") and (ROOT / path).is_file(), entry
        if function:
            assert f"\ndef {function}(" in (ROOT / path).read_text(), entry
