"""The spec key ``probe``: train.sh passes npu-run ``--probe`` (``true``) or ``--probe=SECONDS``,
and nothing at all when the key is absent or ``false``."""

from __future__ import annotations

import pytest

from .conftest import render_values, with_keys


def launcher_lines(**keys) -> list:
    script = dict(render_values(with_keys(**keys)).scripts)["train.sh"]
    return [line.strip() for line in script.splitlines() if "--probe" in line]


@pytest.mark.parametrize(
    "value, expected",
    [(True, ["--probe"]), (45, ["--probe=45"]), (False, [])],
    ids=["true", "seconds", "false"],
)
def test_train_sh_passes_the_probe_to_npu_run(value, expected):
    assert launcher_lines(probe=value) == expected


def test_train_sh_has_no_probe_without_the_key():
    assert launcher_lines() == []


def test_the_probe_set_from_the_command_line_is_typed():
    script = dict(render_values(with_keys(), "probe=20").scripts)["train.sh"]
    assert "--probe=20" in script
