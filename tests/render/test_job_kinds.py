"""Render reads the job kind's record: the spec key ``kind`` and the keys a kind refuses.

What any kind gets is checked with a kind made for the tests (``fake_kind.TrainThing``), unlike
the Volcano Job wherever a kind may differ; the Volcano Job's own output is the golden files'
(test_golden.py).
"""

from __future__ import annotations

import re

import pytest
from npu_job.kinds import KINDS
from npu_job.render.keys import KEYS

from npu_job.errors import SpecError

from . import fake_kind
from .conftest import parsed, spec_from, with_keys
from .fake_kind import INDEX_ENV, NAME

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@pytest.fixture
def registered(monkeypatch):
    yield from fake_kind.register(monkeypatch)


def problems_of(values, *sets):
    with pytest.raises(SpecError) as error:
        spec_from(values, *sets)
    return error.value.problems


def job_object(rendered):
    kind = rendered.spec.job_kind
    (job,) = [
        doc
        for doc in parsed(rendered)
        if (doc["apiVersion"], doc["kind"]) == (kind.api_version, kind.kind)
    ]
    return job


# --- the spec key ----------------------------------------------------------------------------


def test_the_default_kind_is_volcano_and_an_unknown_kind_lists_the_known(registered):
    assert spec_from(with_keys()).kind == "volcano" == KEYS["kind"].default
    assert problems_of(with_keys(kind="pytorch")) == (
        f"kind: expected one of {NAME}, volcano; got 'pytorch'",
    )
    assert problems_of(with_keys(kind="trainthin")) == (
        f"kind: expected one of {NAME}, volcano; got 'trainthin' (did you mean '{NAME}'?)",
    )


def test_a_key_the_kind_refuses_is_a_problem_only_when_given(registered):
    assert spec_from(with_keys(kind=NAME)).queue == "default"  # its default is no problem
    found = problems_of(
        with_keys(kind=NAME, queue="q", nodes=2),
        "network_topology.mode=soft",
    )
    assert found == (
        "queue (from job.yaml): the TrainThing (kind trainthing) cannot honour it: a TrainThing "
        "is queued by no one; remove it or choose another kind",
        "network_topology.mode (from --set): the TrainThing (kind trainthing) cannot honour it: "
        "the network-topology constraint is the Volcano Job's; remove it or choose another kind",
    )
    # the Volcano Job honours both
    assert spec_from(with_keys(queue="q"), "network_topology.mode=soft").queue == "q"


def test_an_unknown_kind_is_its_only_problem_not_a_refusal_of_the_default_kinds(
    registered, monkeypatch
):
    monkeypatch.setattr(type(KINDS["volcano"]), "refused_keys", (("queue", "say it refuses"),))
    assert problems_of(with_keys(queue="q"))[0].startswith("queue: the Volcano Job")
    assert problems_of(with_keys(kind="slurm", queue="q")) == (
        f"kind: expected one of {NAME}, volcano; got 'slurm'",
    )


def test_the_env_may_not_set_what_the_kinds_controller_sets(registered):
    assert problems_of(with_keys(kind=NAME, env={INDEX_ENV: "1", "PET_NODE_RANK": "0"})) == (
        f"env.{INDEX_ENV}: set in every pod by the TrainThing's controller (kind trainthing); "
        "remove it",
        "env.PET_NODE_RANK: set in every pod by the TrainThing's controller (kind trainthing); "
        "remove it",
    )
    assert spec_from(with_keys(env={INDEX_ENV: "1"})).env == ((INDEX_ENV, "1"),)
