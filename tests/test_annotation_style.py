"""One annotation style in the product: typing's generics (``List[int]``, ``Optional[str]``).

The pod side runs on Python 3.8, where annotations evaluated at run time (dataclass fields read
by msgspec, ``typing.get_type_hints``) cannot be ``list[int]`` or ``str | None``; pyproject's ruff
settings keep typing's spelling for that reason, but ruff has no rule that refuses the other one.
Text annotations are not read (the parent-death wrapper writes its own as text: it imports no
typing).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Tuple

from .test_layers import modules

BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}


def annotations(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
            every += [arg for arg in (arguments.vararg, arguments.kwarg) if arg is not None]
            yield from (arg.annotation for arg in every if arg.annotation is not None)
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def other_style(path: Path) -> List[Tuple[int, str]]:
    """``(line, annotation)`` of each annotation written as ``X | Y`` or ``list[...]``."""
    found = []
    for annotation in annotations(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        for node in ast.walk(annotation):
            union = isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
            builtin = (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id in BUILTIN_GENERICS
            )
            if union or builtin:
                found.append((annotation.lineno, ast.unparse(annotation)))
                break
    return found


def test_product_annotations_use_typings_generics():
    found = [
        f"{path.name}:{line}: {text}" for _, path in modules() for line, text in other_style(path)
    ]
    assert found == []


def runtime_builtin_generics(path: Path) -> List[Tuple[int, str]]:
    """``list[...]`` and the like outside annotations: evaluated at import, a TypeError on 3.8."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    in_annotations = {id(node) for annotation in annotations(tree) for node in ast.walk(annotation)}
    return [
        (node.lineno, ast.unparse(node))
        for node in ast.walk(tree)
        if id(node) not in in_annotations
        and isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id in BUILTIN_GENERICS
    ]


def test_no_product_module_subscripts_a_builtin_at_run_time():
    """The launcher runs on the floor Python too (torch 2.1-2.4 images ship 3.8): a type alias
    such as ``Union[int, tuple[bytes, ...]]`` stopped every store module importing there."""
    found = [
        f"{path.name}:{line}: {text}"
        for _, path in modules()
        for line, text in runtime_builtin_generics(path)
    ]
    assert found == []


def test_the_check_sees_both_spellings_and_leaves_text_alone(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import List, Optional\n"
        "def f(a: Optional[int], b: 'int | None') -> List[int]: ...\n"
        "def g(a: int | None) -> None: ...\n"
        "x: dict[str, int] = {}\n"
    )
    assert other_style(source) == [(3, "int | None"), (4, "dict[str, int]")]


def test_the_run_time_check_sees_aliases_and_leaves_annotations_to_the_other(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import Tuple, Union\n"
        "Reply = Union[int, tuple[bytes, ...]]\n"
        "Fine = Union[int, Tuple[bytes, ...]]\n"
        "x: dict[str, int] = {}\n"
    )
    assert runtime_builtin_generics(source) == [(2, "tuple[bytes, ...]")]
