"""Generated clusters look like the real thing and are a pure function of their arguments."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.demo.synthetic import synthetic_cluster


@settings(max_examples=30, deadline=None)
@given(
    nodes=st.integers(1, 80),
    tors=st.integers(1, 12),
    npus=st.sampled_from([1, 4, 8, 16]),
    seed=st.integers(0, 2**16),
    occupancy=st.sampled_from(["even", "uneven"]),
)
def test_v1_rank_table_shape_and_every_tor_used(nodes, tors, npus, seed, occupancy):
    tors = min(tors, nodes)
    table, topology = synthetic_cluster(
        nodes, tors, npus_per_node=npus, seed=seed, occupancy=occupancy
    )
    assert table.version == "1.0" and table.is_completed and table.node_count == nodes
    assert [s.pod_index for s in table.servers] == list(range(nodes))
    assert len({s.server_id for s in table.servers}) == nodes
    for server in table.servers:
        assert [d.device_id for d in server.devices] == [str(i) for i in range(npus)]
        assert [d.rank_id for d in server.devices] == [
            server.pod_index * npus + i for i in range(npus)
        ]
        assert server.pod_name == f"job-worker-{server.pod_index}"
    assert len({d.device_ip for s in table.servers for d in s.devices}) == nodes * npus
    sizes = Counter(topology.placement_of(s.server_id).tors for s in table.servers)
    assert len(sizes) == tors
    if occupancy == "even":
        assert max(sizes.values()) - min(sizes.values()) <= 1
    slots = Counter((p.tors, p.slot) for p in topology.placements.values())
    assert max(slots.values()) == 1  # one server per slot


def test_same_seed_same_cluster_other_seed_other_cluster():
    assert synthetic_cluster(40, 5, seed=3) == synthetic_cluster(40, 5, seed=3)
    assert synthetic_cluster(40, 5, seed=3) != synthetic_cluster(40, 5, seed=4)


def test_scatter_mixes_tors_in_pod_order_and_no_scatter_keeps_them_together():
    def runs(scatter: bool) -> int:
        table, topology = synthetic_cluster(64, 4, seed=1, scatter=scatter)
        tors = [topology.placement_of(s.server_id).tors for s in table.servers]
        return sum(1 for a, b in zip(tors, tors[1:]) if a != b)

    assert runs(False) == 3
    assert runs(True) > 20


def test_uneven_occupancy_is_skewed():
    table, topology = synthetic_cluster(256, 16, seed=2, occupancy="uneven")
    sizes = Counter(p.tors for p in topology.placements.values())
    assert min(sizes.values()) >= 1 and max(sizes.values()) >= 3 * min(sizes.values())


def test_missing_multi_tor_partial_and_outer_tiers():
    table, topology = synthetic_cluster(
        30,
        6,
        seed=9,
        missing_topology=4,
        multi_tor=3,
        partial_nodes=2,
        spine_groups=2,
        super_pods=1,
        npus_per_node=8,
    )
    assert len(topology.placements) == 26
    assert sum(1 for p in topology.placements.values() if len(p.tors) == 2) == 3
    assert sorted(len(s.devices) for s in table.servers)[:3] == [4, 4, 8]
    tiers = Counter(p.tiers for p in topology.placements.values())
    assert set(tiers) == {("superpod-0", "spine-0"), ("superpod-0", "spine-1")}


def test_addresses_stay_canonical_ipv4_far_beyond_a_16_bit_octet_budget():
    """Ids are what real clusters use, so the planner's IPv4 fast path applies at every size (a
    generator that wrote 10.270.0.1 past 51k nodes once made the planner look superlinear)."""
    import socket

    table, _ = synthetic_cluster(70_000, 700, npus_per_node=1)
    for field in ("server_id", "container_ip"):
        values = [getattr(server, field) for server in table.servers]
        assert len(set(values)) == len(values)
        assert all(socket.inet_ntoa(socket.inet_aton(value)) == value for value in values), field


def test_server_ids_do_not_follow_switch_order():
    table, topology = synthetic_cluster(200, 10, seed=0, scatter=False)
    ids = [s.server_id for s in table.servers]
    assert ids != sorted(ids) and all(i.startswith("10.") for i in ids)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nodes": 3, "tors": 4},
        {"nodes": 0, "tors": 0},
        {"nodes": 8, "tors": 2, "occupancy": "random"},
        {"nodes": 8, "tors": 2, "missing_topology": 9},
        {"nodes": 8, "tors": 1, "multi_tor": 1},
        {"nodes": 8, "tors": 2, "spine_groups": 3},
        {"nodes": 8, "tors": 2, "slots_per_tor": 3},
    ],
    ids=[
        "more-tors-than-nodes",
        "empty",
        "unknown-occupancy",
        "too-many-missing",
        "multi-tor-needs-two",
        "too-many-spine-groups",
        "too-few-slots",
    ],
)
def test_impossible_requests_are_refused(kwargs):
    with pytest.raises(ValueError):
        synthetic_cluster(**kwargs)


def test_tor_sizes_place_exactly_that_many_nodes_under_each_tor_in_order():
    table, topology = synthetic_cluster(16, 4, seed=5, tor_sizes=(6, 4, 4, 2))
    per_tor = Counter(topology.placement_of(s.server_id).tors[0] for s in table.servers)
    by_tor = sorted(per_tor.items(), key=lambda item: tuple(map(int, item[0].split("."))))
    assert [count for _, count in by_tor] == [6, 4, 4, 2]


@pytest.mark.parametrize("sizes", [(6, 4, 4), (6, 4, 4, 1), (8, 4, 4, 0), (16, 0, 0, 0)])
def test_tor_sizes_that_do_not_fit_the_job_are_refused(sizes):
    with pytest.raises(ValueError, match="tor_sizes"):
        synthetic_cluster(16, 4, tor_sizes=sizes)
