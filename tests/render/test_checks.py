"""Reading one spec value: a ``--set`` value is the text written where a string is expected and
a typed value where an integer is; a value of the wrong type is one problem naming its key."""

from __future__ import annotations

import pytest

from npu_job.errors import SpecError

from .conftest import MINIMAL, spec_from, with_keys


def test_set_keeps_text_where_a_string_is_expected():
    spec = spec_from(dict(MINIMAL), "env.DEBUG=true", "args={--epochs,90,007}", "nodes=3")
    assert spec.env == (("DEBUG", "true"),)
    assert spec.args == ("--epochs", "90", "007")
    assert spec.nodes == 3


def test_yaml_integers_are_accepted_as_strings_but_floats_and_booleans_are_not():
    assert spec_from(with_keys(args=["--epochs", 90])).args == ("--epochs", "90")
    with pytest.raises(SpecError) as error:
        spec_from(with_keys(args=["--lr", 0.10], env={"FLAG": True}))
    assert error.value.problems == (
        "args[1]: expected a string, got 0.1 (a number) (quote it to keep it exactly as written)",
        "env.FLAG: expected a string, got true (a boolean) (quote it to keep it exactly as written)",
    )
