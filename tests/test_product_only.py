"""The product packages hold the product: a helper that only tests and benchmarks use lives with
them (tests/, benchmarks/), not in a package every pod installs and every reader reads as product.

A name counts as used by the product when any product file other than the line defining it
mentions it (code, ``__all__``, a docstring: a generous reading, so the test never flags a name
the product refers to), or when the packaging config names it (an entry point).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

from .test_layers import REPO, modules

ELSEWHERE = ("tests", "benchmarks")
CONFIG = ("setup.cfg", "pyproject.toml")
WORD = re.compile(r"\w+")


def top_level_names(path: Path) -> Iterable[Tuple[str, int]]:
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node.lineno
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.startswith("__"):
                    yield target.id, node.lineno


def used_only_elsewhere(
    product: Dict[Path, str], elsewhere: Dict[Path, str], config: str = ""
) -> List[str]:
    """``path:line: name`` of each top-level name of ``product`` that no other product line
    (nor ``config``) mentions and some file of ``elsewhere`` does."""
    mentions = Counter(word for text in product.values() for word in WORD.findall(text))
    mentions.update(WORD.findall(config))
    words_of = {path: set(WORD.findall(text)) for path, text in elsewhere.items()}
    found = []
    for path in product:
        for name, line in top_level_names(path):
            if mentions[name] > 1:
                continue
            users = sorted(str(other) for other, words in words_of.items() if name in words)
            if users:
                found.append(f"{path}:{line}: {name} (used only by {', '.join(users[:3])})")
    return found


def test_no_product_module_keeps_a_helper_only_tests_or_benchmarks_use():
    product = {path: path.read_text(encoding="utf-8") for _, path in modules()}
    config = "".join((REPO / name).read_text(encoding="utf-8") for name in CONFIG)
    elsewhere = {
        path: path.read_text(encoding="utf-8")
        for folder in ELSEWHERE
        for path in (REPO / folder).rglob("*.py")
    }
    assert used_only_elsewhere(product, elsewhere, config) == []


def test_the_check_flags_a_function_only_a_test_calls(tmp_path):
    part, main, test = tmp_path / "part.py", tmp_path / "main.py", tmp_path / "test_part.py"
    part.write_text("def used(): ...\n\ndef for_tests(): ...\n\nENTRY = 1\n")
    main.write_text("from part import used\n")
    test.write_text("from part import ENTRY, for_tests, used\n")
    product = {part: part.read_text(), main: main.read_text()}
    assert used_only_elsewhere(product, {test: test.read_text()}, "entry = part:ENTRY") == [
        f"{part}:3: for_tests (used only by {test})"
    ]
