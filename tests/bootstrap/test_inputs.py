"""The one input loader a pod and ``npu-job plan`` share, and what it refuses in both.

Its reading is tested through its two callers (tests/bootstrap/test_run.py, the pod;
tests/cli/test_plan_cli.py, plan); here: that it is one loader standing on the modules below it,
and the job's node count it holds a rank table to.
"""

from __future__ import annotations

from typing import Dict, List, Set

from tests.test_layers import imported, modules

LOADER = ("inputs", "podrun", "topologychain")


def import_cycles() -> List[Set[str]]:
    """Every set of npu_job modules that import each other round in a circle (Tarjan's SCCs)."""
    files = dict(modules())
    graph: Dict[str, Set[str]] = {
        module: {name for name, _ in imported(module, path) if name in files and name != module}
        for module, path in files.items()
    }
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    cycles: List[Set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(component)

    for module in graph:
        if module not in index:
            visit(module)
    return cycles


def test_the_loader_and_the_modules_it_stands_on_import_no_cycle():
    loader = {f"npu_job.bootstrap.{name}" for name in LOADER}
    assert [cycle for cycle in import_cycles() if cycle & loader] == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path, monkeypatch):
    """The finder itself: two modules that import each other, one inside a function."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n")
    fake = [("npu_job.bootstrap.a", tmp_path / "a.py"), ("npu_job.bootstrap.b", tmp_path / "b.py")]
    monkeypatch.setattr(f"{__name__}.modules", lambda: iter(fake))
    assert import_cycles() == [{"npu_job.bootstrap.a", "npu_job.bootstrap.b"}]
