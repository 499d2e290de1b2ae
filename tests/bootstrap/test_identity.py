"""Who am I: this pod's index in the rank table, by its host IP and VC_TASK_INDEX; where the two
disagree, or neither is there, the error says so and nothing is guessed."""

import json

import pytest
from npu_job.bootstrap.identity import find_pod_index, parse_task_index
from npu_job.bootstrap.ranktable import parse_rank_table

from npu_job.errors import InconsistentError, InputError

from .documents import v1_0

TABLE = parse_rank_table(json.dumps(v1_0()).encode(), "t.json")


@pytest.mark.parametrize(
    "host_ip, task_index, expected",
    [("192.168.0.12", 1, 1), ("192.168.0.13", None, 2), (None, 0, 0), ("", 2, 2)],
    ids=["ip-and-index-agree", "ip-only", "index-only", "empty-ip"],
)
def test_find_pod_index(host_ip, task_index, expected):
    assert find_pod_index(TABLE, host_ip, task_index, "t.json") == expected


@pytest.mark.parametrize(
    "host_ip, task_index, error, message",
    [
        (
            "10.0.0.9",
            1,
            InconsistentError,
            "t.json: server_list: expected this host's IP '10.0.0.9' (MA_CURRENT_HOST_IP) among the 3 server ids",
        ),
        (
            "192.168.0.12",
            2,
            InconsistentError,
            "t.json: server_list[1]: this host '192.168.0.12' is pod index 1 in the rank table, but VC_TASK_INDEX is 2",
        ),
        (
            None,
            3,
            InconsistentError,
            "t.json: server_list: expected an entry for VC_TASK_INDEX 3, the rank table lists 3",
        ),
        (None, None, InputError, "environment: MA_CURRENT_HOST_IP: expected this host's IP"),
    ],
    ids=["ip-not-in-table", "index-mismatch", "index-out-of-range", "neither-set"],
)
def test_identity_inconsistencies_are_reported_not_guessed(host_ip, task_index, error, message):
    with pytest.raises(error) as caught:
        find_pod_index(TABLE, host_ip, task_index, "t.json")
    assert caught.value.message.startswith(message)


def test_host_ip_also_matches_a_v1_2_host_ip_field():
    from .documents import v1_2_super_pods

    table = parse_rank_table(json.dumps(v1_2_super_pods()).encode(), "t")
    assert find_pod_index(table, "10.0.0.3", 2, "t") == 2


@pytest.mark.parametrize(
    "value, expected", [(None, None), ("", None), (" 7 ", 7)], ids=["unset", "empty", "spaces"]
)
def test_task_index_parsing(value, expected):
    assert parse_task_index(value) == expected


@pytest.mark.parametrize("value", ["-1", "1" * 5000], ids=["negative", "past-int-limit"])
def test_task_index_must_be_a_number(value):
    with pytest.raises(
        InputError,
        match=r"^environment: VC_TASK_INDEX: expected a non-negative integer pod index, got '",
    ):
        parse_task_index(value)


def test_the_messages_name_the_index_variable_of_the_jobs_kind():
    """Each kind's controller sets this pod's index under its own name (VC_TASK_INDEX is a
    Volcano Job's): the messages name the one the pod was given."""
    with pytest.raises(InconsistentError) as caught:
        find_pod_index(TABLE, "192.168.0.12", 2, "t.json", index_env="SET_INDEX")
    assert caught.value.message.endswith("is pod index 1 in the rank table, but SET_INDEX is 2")
    with pytest.raises(InconsistentError, match="expected an entry for SET_INDEX 3, "):
        find_pod_index(TABLE, None, 3, "t.json", index_env="SET_INDEX")
    with pytest.raises(InputError, match=r"\(or SET_INDEX, or --host-ip/--pod-index\)"):
        find_pod_index(TABLE, None, None, "t.json", index_env="SET_INDEX")
    with pytest.raises(InputError, match="^environment: SET_INDEX: expected a non-negative"):
        parse_task_index("x", "SET_INDEX")
