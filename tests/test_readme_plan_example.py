"""The `npu-job plan` example of docs/ordering.md runs verbatim in an empty directory: its first command writes
the sample inputs (`npu-job demo --write-inputs`), the next reads them, and what they print is what
the page shows (its `...` lines stand for rows left out)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import List, Tuple

from npu_job.cli import main

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "ordering.md").read_text(encoding="utf-8")


def plan_example() -> List[Tuple[str, List[str]]]:
    """(command, the lines the page shows it printing) for each ``$ `` line of the example."""
    section = PAGE.split("# `npu-job plan`", 1)[1]
    block = re.search(r"\n```\n(\$ npu-job .*?)\n```\n", section, re.S)
    assert block, "the plan section has no example block starting with a '$ npu-job' command"
    steps: List[Tuple[str, List[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].split("  #", 1)[0].strip(), []))
        else:
            steps[-1][1].append(line)
    return steps


def test_the_plan_example_runs_verbatim_from_the_inputs_the_demo_writes(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    steps = plan_example()
    assert [command.split()[:2] for command, _ in steps][-1] == ["npu-job", "plan"]
    for command, shown in steps:
        argv = shlex.split(command)
        assert argv[0] == "npu-job"
        assert main(argv[1:]) == 0, command
        out, err = capsys.readouterr()
        printed = [line.rstrip() for line in (err + out).splitlines()]
        wanted = [line.rstrip() for line in shown if line.strip() != "..."]
        remaining = iter(printed)  # the page's lines, in order, each one of the printed lines
        missing = [line for line in wanted if not any(line == seen for seen in remaining)]
        assert missing == [], f"{command!r} printed:\n" + "\n".join(printed)


def test_the_readme_plan_commands_run_in_order_in_an_empty_directory(tmp_path, monkeypatch, capsys):
    """The README shows where a rank table to plan comes from before it plans one, so a
    newcomer's copy of its two lines works on a machine with no cluster."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    lines = [
        line.split("  #", 1)[0].strip()
        for line in readme.splitlines()
        if line.startswith(("npu-job demo --write-inputs", "npu-job plan"))
    ]
    assert [line.split()[:2] for line in lines] == [["npu-job", "demo"], ["npu-job", "plan"]]
    monkeypatch.chdir(tmp_path)
    for command in lines:
        assert main(shlex.split(command)[1:]) == 0, command
    assert "plan: success" in capsys.readouterr().out
