"""A topology is matched to the rank table by every address a server has, and said so.

MindCluster and HCCL tables often name servers (``node-0``, a hostname) and carry the address in
``host_ip`` or ``container_ip``, while ToR sources key servers by address. Tables are built from
the documented v1.0/v1.2 layouts (see documents.py)."""

from __future__ import annotations

import pytest
import yaml
from npu_job.bootstrap.base.model import Collective, PlanStatus
from npu_job.bootstrap.planner import plan
from npu_job.bootstrap.ranktable import parse_rank_table
from npu_job.bootstrap.topology import parse_topology

from .documents import as_json, v1_0, v1_2_super_pods

TORS = ["tor-a", "tor-b", "tor-a", "tor-b"]


def named_v1_0(field: str) -> dict:
    """Four servers named node-<i> whose address is in ``field``."""
    document = v1_0(tuple(f"node-{i}" for i in range(4)))
    for i, server in enumerate(document["server_list"]):
        server[field] = f"10.0.0.{i + 1}"
    return document


def topology_by_address(addresses) -> bytes:
    return yaml.safe_dump({"servers": {a: tor for a, tor in zip(addresses, TORS)}}).encode()


@pytest.mark.parametrize("field", ["host_ip", "container_ip"])
def test_a_table_that_names_its_servers_finds_the_topology_by_its_address_and_says_so(field):
    table = parse_rank_table(as_json(named_v1_0(field)), "t.json")
    topology = parse_topology(
        topology_by_address([f"10.0.0.{i + 1}" for i in range(4)]), "topo.yaml"
    )
    result = plan(table, topology, Collective.RING)
    assert result.status is PlanStatus.SUCCESS
    assert f"topology entries found for 4 of 4 servers: 4 by {field}" in result.reasons
    assert result.pod_of_node_rank in ((0, 2, 1, 3), (1, 3, 0, 2))  # each ToR's servers neighbours


def test_a_topology_that_places_no_server_is_never_a_success_even_with_super_pods():
    """A v1.2 table plans by its super pods alone; a topology given beside it that matches none
    of its servers is a fallback with the reason, not a success that ignored it."""
    table = parse_rank_table(as_json(v1_2_super_pods()), "t.json")
    elsewhere = parse_topology(topology_by_address(["172.31.0.1", "172.31.0.2"]), "topo.yaml")
    result = plan(table, elsewhere, Collective.RING)
    assert result.status is PlanStatus.FAILED
    assert any(
        "has no entry for any of the 4 servers (looked up by server_id, host_ip, container_ip)"
        in reason
        for reason in result.reasons
    )
    assert plan(table, None, Collective.RING).status is PlanStatus.SUCCESS  # super pods alone


def test_the_server_id_wins_when_several_addresses_are_placed():
    document = named_v1_0("host_ip")
    table = parse_rank_table(as_json(document), "t.json")
    by_id = {f"node-{i}": tor for i, tor in enumerate(TORS)}
    by_ip = {f"10.0.0.{i + 1}": "tor-z" for i in range(4)}
    topology = parse_topology(yaml.safe_dump({"servers": {**by_id, **by_ip}}).encode(), "topo.yaml")
    result = plan(table, topology, Collective.RING)
    assert not any("found for" in reason for reason in result.reasons)  # all by server_id
    assert result.pod_of_node_rank in ((0, 2, 1, 3), (1, 3, 0, 2))
