"""npu_job.podfacts is the one place a pod's fact is spelled: the parts import its names.

A product module that writes a file name, an environment name or a default path of the pod as a
string of its own would drift from the others the day one of them changes. Every Python module
the package installs is read, the demo's training script among them; the shipped shell script and
the templates cannot import Python (the renderer hands the templates the paths).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

from npu_job import podfacts

from .test_layers import modules

# "/tmp" is also the pod's own /tmp (the simulator mounts one per pod): another fact, not this one
NOT_CHECKED = {podfacts.OUTPUT_DIR}


def facts() -> Dict[str, str]:
    """Every spelled value of podfacts and the name that defines it."""
    found = {}
    for name, value in vars(podfacts).items():
        if not name.isupper():
            continue
        for text in value if isinstance(value, tuple) else (value,):
            if isinstance(text, str) and text not in NOT_CHECKED:
                found[text] = name
    return found


def literals(path: Path) -> Iterator[Tuple[str, int]]:
    """The string constants of a module that are not docstrings, with their lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.value, node.lineno


# The demo's training script runs in the image, which has torch and no npu-job: it keeps its own
# copies of the facts it reads, held to podfacts by test_the_training_scripts_copies_are_podfacts.
EXAMPLE = "npu_job.examples.train_ddp"


def spelled_again() -> List[str]:
    known = facts()
    found = []
    for module, path in modules():
        if module in ("npu_job.podfacts", EXAMPLE):
            continue
        for text, line in literals(path):
            if text in known:
                found.append(f"{module}:{line}: {text!r} is podfacts.{known[text]}")
    return found


def test_no_product_module_spells_a_pod_fact_of_its_own():
    assert spelled_again() == []


def test_the_training_scripts_copies_are_podfacts():
    path = dict(modules())[EXAMPLE]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    copies = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and hasattr(podfacts, target.id)
    }
    assert copies and copies == {name: getattr(podfacts, name) for name in copies}
    assert not any(
        isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            (getattr(node, "module", None) or alias.name).startswith("npu_job")
            for alias in node.names
        )
        for node in ast.walk(tree)
    ), "the training script runs where npu-job is not installed"


def test_the_check_sees_a_fact_spelled_in_code_but_not_in_a_docstring(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text('"""Writes RANK_AFTER_ACC."""\n\nNAME = "RANK_AFTER_ACC"\n')
    assert [(text, line) for text, line in literals(source) if text in facts()] == [
        ("RANK_AFTER_ACC", 3)
    ]
