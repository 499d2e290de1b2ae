"""The ``npu-job`` front: options every subcommand shares, given before or after the subcommand."""

from __future__ import annotations

import importlib
import logging

import pytest

from npu_job.cli import SUBCOMMANDS, main

#: the fewest arguments each subcommand parses with
REQUIRED = {"render": ["job.yaml"], "plan": ["--rank-table", "rt.json"], "bundle": ["-o", "x.pyz"]}


@pytest.fixture
def level_seen(monkeypatch):
    """Replace each subcommand's body by one that records the log level it runs under.

    This tests the front's parsing and logging set-up, not the commands, so their ``run`` is a
    stand-in here; tests/cli/test_bootstrap_cli.py runs the real bootstrap with -v and -q.
    """
    seen = []
    for module_name, _ in SUBCOMMANDS.values():
        module = importlib.import_module(module_name)

        def record(args, _seen=seen):
            _seen.append(logging.getLogger("npu_job").level)
            return 0

        monkeypatch.setattr(module, "run", record)
    yield seen
    logging.getLogger("npu_job").setLevel(logging.NOTSET)


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
@pytest.mark.parametrize(
    "before, after, level",
    [
        pytest.param([], [], logging.INFO, id="default"),
        pytest.param(["-v"], [], logging.DEBUG, id="v-before"),
        pytest.param([], ["-v"], logging.DEBUG, id="v-after"),
        pytest.param([], ["--verbose"], logging.DEBUG, id="verbose-after"),
        pytest.param([], ["-vv"], logging.DEBUG, id="vv-after"),
        pytest.param(["-q"], [], logging.WARNING, id="q-before"),
        pytest.param([], ["-q"], logging.WARNING, id="q-after"),
        pytest.param([], ["--quiet"], logging.WARNING, id="quiet-after"),
        pytest.param(["-v"], ["-q"], logging.WARNING, id="q-wins-over-v"),
    ],
)
def test_verbose_and_quiet_work_before_and_after_every_subcommand(
    command, before, after, level, level_seen
):
    assert main([*before, command, *REQUIRED.get(command, []), *after]) == 0
    assert level_seen == [level]


def test_verbose_counts_on_both_sides(monkeypatch):
    import npu_job.cli as cli

    verbosity = []
    monkeypatch.setattr(cli, "setup_logging", verbosity.append)
    monkeypatch.setattr(importlib.import_module("npu_job.cli.demo"), "run", lambda args: 0)
    assert main(["-v", "demo", "-vv"]) == 0
    assert verbosity == [3]


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_subcommand_help_lists_verbose_and_quiet(command, capsys):
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    assert "-v, --verbose" in text and "-q, --quiet" in text


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_the_fronts_one_line_help_is_the_subcommands_own(command):
    """``npu-job --help`` names each subcommand without importing it, so the front keeps a copy
    of the one-line help each module declares (``HELP``); the two must say the same."""
    module_name, help_text = SUBCOMMANDS[command]
    assert help_text == importlib.import_module(module_name).HELP
