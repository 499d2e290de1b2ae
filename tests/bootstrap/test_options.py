"""The option table (bootstrap/options.py) is the one declaration of the bootstrap's settings: the
parser, the environment fallbacks, the help and docs/bootstrap.md all follow it."""

import argparse
from pathlib import Path

import pytest
from npu_job.bootstrap.base.model import Collective
from npu_job.bootstrap.command import configure, epilog
from npu_job.bootstrap.options import (
    OPTIONS,
    BootstrapOptions,
    collective_from_hccl_algo,
    label_keys_from_text,
    options_markdown,
    resolve,
    resolve_one,
    underscore_alias,
)

from npu_job.errors import InputError

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "bootstrap.md").read_text(encoding="utf-8")
FLAGGED = [option for option in OPTIONS if option.flag]
SAMPLE = {"seconds": "7", "count": "16", "labels": "a/spine,a/leaf", "collective": "nhr"}


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser()
    configure(made)
    return made


def test_the_docs_table_is_the_option_table():
    assert options_markdown().strip() in PAGE, (
        "regenerate the table in docs/bootstrap.md from options_markdown()"
    )


def test_every_named_row_is_an_options_field_and_every_field_a_row():
    named = [option.name for option in OPTIONS if option.name]
    assert sorted(named) == sorted(BootstrapOptions._fields)
    assert len(set(named)) == len(named)


@pytest.mark.parametrize("option", FLAGGED, ids=lambda option: option.flag)
def test_the_parser_takes_each_flag_in_both_spellings(option):
    switch = option.is_switch
    value = option.choices[-1] if option.choices else SAMPLE.get(option.kind, "x")
    for spelling in filter(None, (option.flag, underscore_alias(option.flag))):
        argv = [spelling] if switch else [spelling, value]
        parsed = vars(parser().parse_args(argv))
        assert parsed[option.name] not in (None, False), (spelling, parsed)


def test_help_names_each_flags_variable_and_default_and_lists_every_variable():
    text = parser().format_help()
    flat = " ".join(text.split())
    for option in FLAGGED:
        assert option.flag in text
        if option.env:
            assert option.env in flat, option.env
    listed = " ".join(epilog().split())
    for option in OPTIONS:
        if option.env:
            assert option.env in listed, option.env
    assert "(default: $NPU_JOB_WAIT_TIMEOUT, else 300)" in flat
    assert "(also NPU_JOB_STRICT=1)" in flat


@pytest.mark.parametrize(
    "option",
    [option for option in FLAGGED if option.env and option.kind == "text"],
    ids=lambda option: option.flag,
)
def test_a_flag_wins_over_its_variable_which_wins_over_the_default(option):
    assert getattr(resolve({}, {}), option.name) == getattr(BootstrapOptions(), option.name)
    assert getattr(resolve({}, {option.env: "from-env"}), option.name) == "from-env"
    both = resolve({option.name: "from-flag"}, {option.env: "from-env"})
    assert getattr(both, option.name) == "from-flag"


def test_numbers_switches_label_keys_and_hccl_algo_read_from_the_environment():
    options = resolve(
        {},
        {
            "NPU_JOB_WAIT_TIMEOUT": "20",
            "NPU_JOB_POLL_INTERVAL": "0.5",
            "NPU_JOB_FULL_NODE_DEVICES": "16",
            "NPU_JOB_STRICT": "yes",
            "NPU_JOB_K8S_TOPOLOGY": "off",
            "NPU_JOB_TOPOLOGY_LABELS": "example.com/spine, example.com/rack",
            "HCCL_ALGO": "level0:NA;level1:NHR",
        },
    )
    assert (options.wait_timeout, options.poll_interval, options.full_node_devices) == (20, 0.5, 16)
    assert options.strict and not options.k8s_topology
    assert options.topology_labels == ("example.com/spine", "example.com/rack")
    assert options.collective == "nhr"
    defaults = resolve({}, {"NPU_JOB_K8S_TOPOLOGY": "anything", "NPU_JOB_STRICT": "0"})
    assert defaults.k8s_topology and not defaults.strict
    assert (defaults.wait_timeout, defaults.poll_interval, defaults.output_dir) == (300, 5, "/tmp")


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"NPU_JOB_WAIT_TIMEOUT": "soon"},
            "environment: NPU_JOB_WAIT_TIMEOUT: expected a number of seconds >= 0, got 'soon'",
        ),
        (
            {"NPU_JOB_FULL_NODE_DEVICES": "0"},
            "environment: NPU_JOB_FULL_NODE_DEVICES: expected a whole number >= 1, got '0'",
        ),
        (
            {"NPU_JOB_TOPOLOGY_LABELS": "a,,b"},
            "environment: NPU_JOB_TOPOLOGY_LABELS: expected label keys separated by commas",
        ),
    ],
    ids=["seconds", "count", "labels"],
)
def test_a_bad_value_names_its_variable(env, message):
    with pytest.raises(InputError) as raised:
        resolve({}, env)
    assert raised.value.message.startswith(message)


def test_strict_and_the_output_dir_read_alone_despite_another_bad_value():
    env = {"NPU_JOB_WAIT_TIMEOUT": "soon", "NPU_JOB_STRICT": "1", "NPU_JOB_OUTPUT_DIR": "/o"}
    with pytest.raises(InputError):
        resolve({}, env)
    assert resolve_one("strict", {}, env) is True
    assert resolve_one("output_dir", {}, env) == "/o"
    assert resolve_one("output_dir", {}, {}) == "/tmp"


@pytest.mark.parametrize("text", ["", "a,,b", "a, b c", ","])
def test_bad_label_key_lists_are_one_line(text):
    with pytest.raises(InputError) as caught:
        label_keys_from_text(text, "NPU_JOB_TOPOLOGY_LABELS")
    assert caught.value.message.startswith(
        "environment: NPU_JOB_TOPOLOGY_LABELS: expected label keys separated by commas, outermost first"
    )


# --- HCCL_ALGO ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("level0:NA;level1:H-D_R", Collective.RHD),
        ("level0:NA;level1:ring", Collective.RING),
        ("level0:NA;level1:NHR", Collective.NHR),
        ("level0:NA;level1:NHR_V1", Collective.NHR),
        ("level0:NA;level1:NB", Collective.NHR),
        ("level0:NA;level1:pipeline", Collective.RING),
        (" level0:NA ; level1:h-d_r ", Collective.RHD),
        ("level0:NA;level1:ring;level2:NHR", Collective.RING),
        ("allgather=level0:NA;level1:ring/allreduce=level0:NA;level1:H-D_R", Collective.RHD),
        ("alltoall=level0:NA;level1:pairwise/reducescatter=level0:NA;level1:NHR", Collective.NHR),
        ("H-D_R", Collective.RHD),
        ("level0:NA;level1:pairwise", None),
        ("level0:NA;level1:AHC", None),
        ("level0:NA", None),
        ("level0:NA;level1:fullmesh", None),
        ("", None),
        (None, None),
        ("nonsense", None),
    ],
    ids=lambda value: repr(value),
)
def test_hccl_algo_maps_the_inter_server_algorithm(value, expected):
    assert collective_from_hccl_algo(value) is expected


# --- the job's kind ---------------------------------------------------------------------------


def test_the_kind_is_volcano_unless_the_flag_or_npu_job_kind_names_another(test_kinds):
    from npu_job.kinds import KINDS

    from .testkind import NUMBERED

    assert resolve({}, {}).kind is KINDS["volcano"] is BootstrapOptions().kind
    assert resolve({}, {"NPU_JOB_KIND": "numbered"}).kind is NUMBERED
    assert resolve({}, {"NPU_JOB_KIND": " numbered "}).kind is NUMBERED
    assert resolve({"kind": "volcano"}, {"NPU_JOB_KIND": "numbered"}).kind is KINDS["volcano"]
    assert resolve({}, {"NPU_JOB_KIND": "  "}).kind is KINDS["volcano"]  # blank: unset
    assert resolve_one("kind", {"kind": "numbered"}, {}) is NUMBERED


@pytest.mark.parametrize(
    "flags, env, named",
    [
        ({}, {"NPU_JOB_KIND": "slurm"}, "environment: NPU_JOB_KIND"),
        ({"kind": "slurm"}, {}, "command line: --kind"),
    ],
    ids=["variable", "flag"],
)
def test_an_unknown_kind_is_one_line_listing_the_known(test_kinds, flags, env, named):
    from npu_job.kinds import KINDS

    known = ", ".join(sorted(KINDS))
    assert "numbered" in known and "volcano" in known
    with pytest.raises(InputError) as raised:
        resolve(flags, env)
    assert raised.value.message == f"{named}: expected a job kind, one of {known}; got 'slurm'"


def test_this_pods_index_is_read_from_its_kinds_variable_and_the_flag_wins(test_kinds):
    """A Volcano pod's is VC_TASK_INDEX; a pod of another kind reads its own (and not Volcano's,
    which its controller never sets); --pod-index overrides either."""
    env = {"VC_TASK_INDEX": "3", "SET_INDEX": "5"}
    numbered = {**env, "NPU_JOB_KIND": "numbered"}
    assert resolve({}, env).pod_index == "3"
    assert resolve({}, numbered).pod_index == "5"
    assert resolve({}, {"VC_TASK_INDEX": "3", "NPU_JOB_KIND": "numbered"}).pod_index is None
    assert resolve({"pod_index": "7"}, numbered).pod_index == "7"
    assert resolve_one("pod_index", {}, numbered) == "5"
    assert resolve_one("pod_index", {"kind": "volcano"}, numbered) == "3"


def test_the_help_and_docs_name_the_index_variable_as_the_kinds():
    text = " ".join(parser().format_help().split())
    assert (
        "this pod's scheduler index, a cross-check (default: $VC_TASK_INDEX or the job kind's own)"
        in text
    )
    assert (
        "| `--pod-index N` | `VC_TASK_INDEX` or the job kind's own | unset |" in options_markdown()
    )
    assert "| `--kind KIND` | `NPU_JOB_KIND` | `volcano` |" in options_markdown()
