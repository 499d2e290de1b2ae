"""The lint setup CI runs (``nox -s lint``): the session, and the link tree mypy reads through.

Cheap checks only (no network, no mypy run): the session exists, CI's plain ``nox`` runs it and it
runs the pinned tools on the right commands; ``.ci/typecheck.py`` lays out every folder setup.cfg's
``package_dir`` maps (read from setup.cfg, so a new entry needs no edit there) and every module it
checks exists in that layout.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _typecheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / ".ci" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _noxfile() -> ast.Module:
    return ast.parse((ROOT / "noxfile.py").read_text())


def _session(name: str) -> ast.FunctionDef:
    for node in _noxfile().body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"noxfile.py has no function {name}")


def _run_commands(function: ast.FunctionDef) -> List[List[str]]:
    """The string arguments of each ``session.run(...)`` in ``function``, in order."""
    commands = []
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "run"
        ):
            commands.append(
                [
                    arg.value
                    for arg in node.args
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                ]
            )
    return commands


def test_lint_session_is_a_nox_session_ci_runs() -> None:
    lint = _session("lint")
    decorators = [ast.unparse(decorator) for decorator in lint.decorator_list]
    assert decorators == ["nox.session"]
    sessions = [
        node
        for node in ast.walk(_noxfile())
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "nox.options.sessions"
    ]
    assert len(sessions) == 1
    assert "lint" in ast.literal_eval(sessions[0].value)


def test_lint_session_installs_the_pinned_tools_and_runs_them() -> None:
    tools = [
        node
        for node in _noxfile().body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "LINT_TOOLS"
    ]
    assert len(tools) == 1
    pinned = ast.literal_eval(tools[0].value)
    assert {"ruff==0.17.6", "mypy==2.4.1", "types-PyYAML", "types-requests"} <= set(pinned)
    assert "session.install(*LINT_TOOLS)" in ast.unparse(_session("lint"))
    assert _run_commands(_session("lint")) == [
        ["python", ".ci/typecheck.py"],
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
    ]


def _package_dir() -> Dict[str, str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["package_dir"].strip().splitlines()
    return {name.strip(): folder.strip() for name, folder in (line.split("=") for line in lines)}


def test_link_tree_maps_every_package_dir_entry(tmp_path: Path) -> None:
    mapped = _package_dir()
    assert mapped  # setup.cfg still maps folders: else this test checks nothing
    tree = _typecheck().build_link_tree(tmp_path / "tree")
    for name, folder in mapped.items():
        laid_out = tree.joinpath(*name.split("."))
        for entry in (ROOT / folder).iterdir():  # the folder itself, or a directory of its entries
            if f"{name}.{entry.name}" not in mapped:
                assert (laid_out / entry.name).samefile(entry), (name, entry.name)
        assert (laid_out / "__init__.py").samefile(ROOT / folder / "__init__.py"), name
    assert (tree / "npu_job" / "__init__.py").samefile(ROOT / "npu_job" / "__init__.py")
    assert (tree / "npu_job" / "cli").samefile(ROOT / "npu_job" / "cli")


def test_link_tree_follows_a_new_package_dir_entry(tmp_path: Path) -> None:
    """A folder mapped tomorrow is laid out too: the mapping is read, not listed in the script."""
    root = tmp_path / "repo"
    (root / "npu_job").mkdir(parents=True)
    (root / "npu_job" / "__init__.py").write_text("")
    (root / "fresh").mkdir()
    (root / "fresh" / "__init__.py").write_text("")
    (root / "setup.cfg").write_text("[options]\npackage_dir =\n    npu_job.fresh = fresh\n")
    tree = _typecheck().build_link_tree(tmp_path / "tree", root)
    assert (tree / "npu_job" / "fresh").samefile(root / "fresh")
    (root / "setup.cfg").write_text("[options]\npackage_dir =\n    elsewhere.fresh = fresh\n")
    with pytest.raises(ValueError, match="elsewhere.fresh"):
        _typecheck().build_link_tree(tmp_path / "tree2", root)
    (root / "fresh" / "module.py").write_text("")
    (root / "inner").mkdir()
    (root / "inner" / "__init__.py").write_text("")
    (root / "setup.cfg").write_text(
        "[options]\npackage_dir =\n    npu_job.fresh.inner = inner\n    npu_job.fresh = fresh\n"
    )
    tree = _typecheck().build_link_tree(tmp_path / "tree3", root)  # a folder inside a mapped one
    assert (tree / "npu_job" / "fresh" / "inner").samefile(root / "inner")
    assert (tree / "npu_job" / "fresh" / "module.py").samefile(root / "fresh" / "module.py")


def test_every_checked_module_exists_in_the_link_tree(tmp_path: Path) -> None:
    typecheck = _typecheck()
    tree = typecheck.build_link_tree(tmp_path / "tree")
    missing = [
        name
        for name in typecheck.PURE_CORE
        if not tree.joinpath(*name.split(".")).with_suffix(".py").is_file()
        and not (tree.joinpath(*name.split(".")) / "__init__.py").is_file()
    ]
    assert missing == []
