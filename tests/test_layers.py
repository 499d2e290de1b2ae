"""The import layers: entry points and the demo sit on the three parts, which sit on a shared core.

A part (bootstrap, render, launcher) never imports the CLI, the demo or another part; the core
(errors and their reporting, file I/O, logging, the pod's facts, reading numbers, polling) imports
none of them. Every import counts, also one inside a function. import-linter cannot check this package (its parts
live in top-level folders mapped into ``npu_job`` by ``package_dir``, which grimp does not follow),
so the graph is read here from the sources, with the mapping taken from ``setup.cfg``.
"""

from __future__ import annotations

import ast
import configparser
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Mapping, Optional, Set, Tuple

REPO = Path(__file__).resolve().parents[1]

# module prefix -> (layer, part); the longest matching prefix decides, higher layers import lower
LAYERS: Dict[str, Tuple[int, str]] = {
    "npu_job": (0, "core"),  # the root package: __version__ only
    "npu_job.errors": (0, "core"),
    "npu_job.fileio": (0, "core"),
    "npu_job.logs": (0, "core"),
    "npu_job.podfacts": (0, "core"),
    "npu_job.parsing": (0, "core"),
    "npu_job.polling": (0, "core"),
    "npu_job.bundle": (0, "core"),  # what the job's bundle is, and building it from the sources
    "npu_job.bundlezip": (0, "core"),  # the bundle's zip archive, byte for byte
    # files the commands ship (the pod's scripts, the demo's workload); they import the core at most
    "npu_job.scripts": (0, "data"),
    "npu_job.examples": (0, "data"),
    "npu_job.bootstrap": (1, "bootstrap"),
    "npu_job.render": (1, "render"),
    "npu_job.launcher": (1, "launcher"),
    "npu_job.demo": (2, "demo"),
    "npu_job.cli": (3, "entry points"),
    "npu_job.__main__": (3, "entry points"),
    "npu_job.pod": (3, "entry points"),  # `python3 npu-job.pyz COMMAND`, the bundle's own
    # `python -m npu_job.bootstrap` / `python -m npu_job.launcher` are commands, like the CLI's
    "npu_job.bootstrap.__main__": (3, "entry points"),
    "npu_job.launcher.__main__": (3, "entry points"),
}
LAYER_NAMES = {0: "core", 1: "parts", 2: "demo", 3: "entry points"}


def package_dirs() -> Dict[str, Path]:
    """Each package of setup.cfg and its folder (``package_dir`` maps some of them elsewhere)."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    packages = config["options"]["packages"].split()
    mapped = dict(
        (name.strip(), folder.strip())
        for line in config["options"]["package_dir"].strip().splitlines()
        for name, folder in [line.split("=")]
    )
    folders = {}
    for name in packages:  # as setuptools does: the longest mapped prefix, then folders
        parent = max(
            (known for known in mapped if name == known or name.startswith(known + ".")),
            key=len,
            default="",
        )
        rest = name[len(parent) :].replace(".", "/")
        folders[name] = REPO / (mapped[parent] + rest if parent else name.replace(".", "/"))
    assert all(folder.is_dir() for folder in folders.values()), folders
    return folders


def modules() -> Iterator[Tuple[str, Path]]:
    for package, folder in package_dirs().items():
        for path in sorted(folder.glob("*.py")):
            yield (package if path.stem == "__init__" else f"{package}.{path.stem}"), path


def import_statements(tree: ast.AST, package: str) -> Iterator[Tuple[List[str], int]]:
    """Each import statement anywhere in ``tree`` (a module of ``package``): the absolute names
    it may bring, and its line. ``import X, Y`` brings the modules ``X`` and ``Y``; ``from X
    import a`` brings ``X`` first, then ``X.a`` (a module, or a name defined in ``X``). Relative
    imports are resolved against ``package``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield [alias.name], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            yield [base] + [f"{base}.{alias.name}" for alias in node.names], node.lineno


def imported(module: str, path: Path) -> Iterator[Tuple[str, int]]:
    """The npu_job modules ``module`` imports anywhere in its file, with line numbers."""
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    for names, line in import_statements(ast.parse(path.read_text(), str(path)), package):
        for name in names:
            if name == "npu_job" or name.startswith("npu_job."):
                yield name, line


def layer_of(module: str) -> Optional[Tuple[int, str]]:
    best = max(
        (prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")),
        key=len,
        default=None,
    )
    return LAYERS[best] if best is not None else None


# The one way from a part into another: the launcher's rendezvous root plans each round with the
# bootstrap's own planner, through the pure round-plan module (nodereport), so that a round of the
# pods every bootstrap saw gets the bootstrap's order (one planner, not two).
BETWEEN_PARTS = {("launcher", "npu_job.bootstrap.nodereport")}


def violations() -> List[str]:
    found = []
    for module, path in modules():
        importer = layer_of(module)
        assert importer is not None, f"{module} belongs to no layer: add it to LAYERS"
        for name, line in imported(module, path):
            target = layer_of(name)
            if target is None or target[1] == importer[1]:
                continue
            if any(
                importer[1] == part and (name == allowed or name.startswith(allowed + "."))
                for part, allowed in BETWEEN_PARTS
            ):
                continue
            upward = target[0] > importer[0]
            sideways = target[0] == importer[0] and importer[0] == 1  # one part into another
            if upward or sideways:
                found.append(
                    f"{path.relative_to(REPO)}:{line}: {module} ({importer[1]}) imports "
                    f"the {target[1]}"
                )
    return sorted(set(found))


def test_no_import_runs_upward_or_between_parts():
    assert violations() == []


def test_every_module_has_a_layer_and_every_layer_has_modules():
    seen = {layer_of(module) for module, _ in modules()}
    assert None not in seen
    assert {layer for layer, _ in seen} == set(LAYER_NAMES)


def test_the_checker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The checker itself: a function-level and a relative import both count."""
    source = tmp_path / "sample.py"
    source.write_text("from . import torchcompat\n\ndef f():\n    from npu_job.cli import main\n")
    names = {name for name, _ in imported("npu_job.launcher.sample", source)}
    assert {"npu_job.launcher.torchcompat", "npu_job.cli.main"} <= names


# the folders whose modules import their siblings relatively (one part, or the CLI)
RELATIVE_INSIDE = (
    "npu_job.bootstrap",
    "npu_job.render",
    "npu_job.launcher",
    "npu_job.demo",
    "npu_job.cli",
)


def absolute_sibling_imports() -> Iterator[str]:
    """``from npu_job.<part>... import`` inside that part: the path exists only after setup.cfg's
    package_dir mapping, where ``from .x import`` names the folder a reader sees."""
    for module, path in modules():
        part = next((p for p in RELATIVE_INSIDE if module == p or module.startswith(p + ".")), None)
        if part is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module == part or node.module.startswith(part + "."):
                    yield f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(part + "."):
                        yield f"{path.relative_to(REPO)}:{node.lineno}: import {alias.name}"


def test_inside_a_part_siblings_are_imported_relatively():
    assert list(absolute_sibling_imports()) == []


def import_graph(prefix: str) -> Dict[str, Set[str]]:
    """Each module under ``prefix`` and the modules under it that it imports, anywhere in its
    file (``from . import x`` imports the package and ``x``; ``from .x import name``, ``x``)."""
    found = dict(modules())
    inside = {name for name in found if name == prefix or name.startswith(prefix + ".")}
    graph: Dict[str, Set[str]] = {}
    for module in sorted(inside):
        targets = set()
        for name, _ in imported(module, found[module]):
            target = name if name in inside else name.rpartition(".")[0]
            if target in inside and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def cycles(graph: Mapping[str, Set[str]]) -> List[FrozenSet[str]]:
    """The import cycles of ``graph``: each set of modules that reach one another (its strongly
    connected components of more than one module, by Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[FrozenSet[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = {stack.pop()}
            while module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found, key=sorted)


def test_no_import_cycle_runs_among_the_bootstrap_modules():
    found = cycles(import_graph("npu_job.bootstrap"))
    assert [sorted(cycle) for cycle in found] == []


def test_the_cycle_finder_sees_a_cycle_through_three_modules_and_none_in_a_chain():
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(ring) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


FLOOR = "npu_job.bootstrap.base"


def test_the_bootstrap_floor_imports_nothing_of_the_bootstrap_above_it():
    """``bootstrap/base/`` is what the readers, the cluster's objects and the run stand on."""
    found = dict(modules())
    above = [
        f"{found[module].relative_to(REPO)}: imports {target}"
        for module, targets in import_graph("npu_job.bootstrap").items()
        if module == FLOOR or module.startswith(FLOOR + ".")
        for target in sorted(targets)
        if not (target == FLOOR or target.startswith(FLOOR + ".")) and target != "npu_job.bootstrap"
    ]
    assert above == []


def test_the_option_table_stands_on_the_floor_alone():
    """Every reader and the run read the options, so the options read nothing of them."""
    targets = import_graph("npu_job.bootstrap")["npu_job.bootstrap.options"]
    above = {t for t in targets if not (t == FLOOR or t.startswith(FLOOR + "."))}
    assert above <= {"npu_job.bootstrap"}


def test_the_core_folder_imports_neither_the_bootstrap_nor_the_launcher():
    """``npu_job/*.py`` is the small core both parts stand on (and ``python -m npu_job``, which
    goes through the CLI); a module that runs a part is an entry point and lives elsewhere."""
    parts = ("npu_job.bootstrap", "npu_job.launcher")
    found = [
        f"{path.relative_to(REPO)}:{line}: imports {name}"
        for module, path in modules()
        if path.parent == REPO / "npu_job"
        for name, line in imported(module, path)
        if any(name == part or name.startswith(part + ".") for part in parts)
    ]
    assert found == []
