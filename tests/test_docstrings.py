"""A docstring's cross-reference (``:func:`name```, ``:class:`.module.Name```, ...) names a thing
that exists: a reader who follows one to a function renamed long ago is lost.

References are resolved from the sources alone: a bare name in its own module (defined or
imported there, or a member of one of its classes), ``Class.member`` in that class,
``.module.Name`` in the module's package, ``npu_job.x.Name`` from the package root. Names of other
libraries (torch, the standard library) are not checked.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

from .test_layers import modules

REFERENCE = re.compile(r":(?:func|meth|class|mod|data|attr|exc):`~?([^`<>]+)`")


class Namespace:
    """What one module defines or imports at its top level, and each of its classes' members."""

    def __init__(self, path: Path) -> None:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        self.names: Set[str] = set()
        self.members: Dict[str, Set[str]] = {}
        self.docstrings: List[str] = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node, clean=False)
                if text:
                    self.docstrings.append(text)
        for node in tree.body:
            self.names |= _bound(node)
            if isinstance(node, ast.ClassDef):
                members: Set[str] = set()
                for item in ast.walk(node):
                    members |= _bound(item)
                    if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        members.add(item.attr)  # self.name = ...
                self.members[node.name] = members


def _bound(node: ast.AST) -> Set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    targets: List[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks, optional imports
        return {name for child in ast.iter_child_nodes(node) for name in _bound(child)}
    return {
        name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)
    }


def _resolves(
    target: str, module: str, package: str, spaces: Dict[str, Namespace]
) -> Optional[bool]:
    """True or False for a reference into npu_job; None for another library's name."""
    target = target.rstrip("()")
    if target.startswith("."):
        base = package.rsplit(".", len(target) - len(target.lstrip(".")) - 1)[0]
        target = f"{base}.{target.lstrip('.')}"
    elif target.split(".")[0] != "npu_job":
        space = spaces[module]
        head, _, rest = target.partition(".")
        if head in space.names:
            return not rest or head not in space.members or rest in space.members[head]
        if not rest and any(head in members for members in space.members.values()):
            return True  # a method or attribute of a class here, named from inside it
        if "." in target and importlib.util.find_spec(head) is not None:
            return None  # torch.distributed..., http.client...
        return False
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        owner = ".".join(parts[:cut])
        if owner in spaces:
            rest = parts[cut:]
            if not rest:
                return True
            space = spaces[owner]
            if rest[0] not in space.names:
                return False
            return (
                len(rest) == 1 or rest[0] not in space.members or rest[1] in space.members[rest[0]]
            )
    return False


def dangling() -> Iterator[str]:
    found = list(modules())
    spaces = {module: Namespace(path) for module, path in found}
    for module, path in found:
        package = module if path.stem == "__init__" else module.rpartition(".")[0]
        for text in spaces[module].docstrings:
            for target in REFERENCE.findall(text):
                if _resolves(target, module, package, spaces) is False:
                    yield f"{path.name} ({module}): {target}"


def test_every_cross_reference_in_a_docstring_names_something_that_exists():
    assert list(dangling()) == []


def test_the_check_finds_a_reference_to_a_name_that_is_gone(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        '"""See :func:`decide`, :meth:`Tracker.seen`, :meth:`Tracker.gone`, :meth:`seen`,'
        ' :func:`settled`."""\n'
        "class Tracker:\n    def seen(self): ...\n\ndef settled(): ...\n"
    )
    spaces = {"npu_job.sample": Namespace(source)}
    verdicts = {
        target: _resolves(target, "npu_job.sample", "npu_job", spaces)
        for target in REFERENCE.findall(spaces["npu_job.sample"].docstrings[0])
    }
    assert verdicts == {
        "decide": False,
        "Tracker.seen": True,
        "Tracker.gone": False,
        "seen": True,
        "settled": True,
    }
