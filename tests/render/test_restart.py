"""The spec key ``restart`` on every registered kind: its default is the kind's own and renders
what the kind rendered before the key existed, a value the kind accepts changes its object (the
controller is told), and a value it has no mechanism for is refused naming the key, the value
and the kind, never dropped. What each value renders, kind by kind, is in test_kind_*.py."""

from __future__ import annotations

import pytest
from npu_job.kinds import KIND_NAMES, KINDS
from npu_job.render.keys import RESTARTS

from npu_job.errors import SpecError

from .conftest import render_values, spec_from, with_keys

#: a spec every kind takes (npu: the AscendJob runs nothing else)
VALUES = with_keys(nodes=4)
CASES = [(kind, value) for kind in KIND_NAMES for value in RESTARTS]


def test_the_default_is_the_kinds_own_and_is_never_refused():
    for name in KIND_NAMES:
        kind = KINDS[name]
        assert kind.restart_default in RESTARTS, name
        assert kind.restart_default not in dict(kind.refused_restarts), name
        assert spec_from(VALUES, f"kind={name}").restart == kind.restart_default, name
        assert set(dict(kind.refused_restarts)) <= set(RESTARTS), name


@pytest.mark.parametrize("name", KIND_NAMES)
def test_giving_the_default_renders_the_stream_of_leaving_it_out(name):
    kind = KINDS[name]
    left_out = render_values(VALUES, f"kind={name}").stream()
    given = render_values(VALUES, f"kind={name}", f"restart={kind.restart_default}").stream()
    assert given == left_out


@pytest.mark.parametrize(("name", "value"), CASES, ids=lambda case: str(case))
def test_every_other_value_is_rendered_or_refused_naming_key_value_and_kind(name, value):
    kind = KINDS[name]
    if value == kind.restart_default:
        return
    why = dict(kind.refused_restarts).get(value)
    if why is None:
        default = render_values(VALUES, f"kind={name}").stream()
        assert render_values(VALUES, f"kind={name}", f"restart={value}").stream() != default
        return
    with pytest.raises(SpecError) as error:
        spec_from(VALUES, f"kind={name}", f"restart={value}")
    (problem,) = [p for p in error.value.problems if p.startswith("restart")]
    assert f"(kind {name}) cannot honour {value!r}: {why}" in problem, problem
    assert f"use {kind.restart_default!r} (its default)" in problem, problem


def test_an_unknown_value_is_a_choice_problem():
    with pytest.raises(SpecError) as error:
        spec_from(VALUES, "restart=node")
    (problem,) = error.value.problems
    assert problem.startswith("restart") and "expected one of job, pod" in problem, problem
