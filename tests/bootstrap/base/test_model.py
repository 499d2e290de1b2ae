"""The domain model: plans are permutations and say where rank 0 went."""

import pytest
from npu_job.bootstrap.base.columns import DeviceColumns, servers_from_device_columns
from npu_job.bootstrap.base.model import (
    Collective,
    Placement,
    Plan,
    PlanStatus,
    RankTable,
    Topology,
)


def test_plan_inverse_master_index_and_platform_mapping_string():
    plan = Plan(PlanStatus.SUCCESS, node_rank_of_pod=(2, 0, 1), collective=Collective.RING)
    assert plan.pod_of_node_rank == (1, 2, 0)
    assert plan.master_index == 1
    assert plan.rank_mapping == "0-1,1-2,2-0"
    assert not plan.is_identity


def test_identity_plan_keeps_master_at_pod_zero():
    plan = Plan(PlanStatus.FAILED, (0, 1), Collective.RING, reasons=("fewer than 3 nodes",))
    assert plan.is_identity and plan.master_index == 0 and plan.rank_mapping == "0-0,1-1"


@pytest.mark.parametrize(
    "ranks",
    [(0, 0, 1), (1, 2), (0, 2), (-1, 1), (2, 0, 0)],
    ids=["duplicate", "no-zero", "gap", "negative", "duplicate-below-the-top"],
)
def test_plan_rejects_anything_but_a_permutation(ranks):
    with pytest.raises(ValueError, match="not a permutation"):
        Plan(PlanStatus.SUCCESS, ranks, Collective.RING)


def test_placement_canonicalises_tors_and_topology_is_read_only_and_sorted():
    assert Placement(tors=("b", "a", "b")).tors == ("a", "b")
    topo = Topology({"10.0.0.2": Placement(tors=("t1",)), "10.0.0.1": Placement(tors=("t0",))})
    assert list(topo.placements) == ["10.0.0.1", "10.0.0.2"]
    assert topo.placement_of("10.0.0.9") is None
    with pytest.raises(TypeError):
        topo.placements["x"] = Placement()  # type: ignore[index]
    assert hash(topo) == hash(Topology(dict(reversed(list(topo.placements.items())))))


def test_rank_table_device_counts_are_the_servers_device_counts_in_pod_order():
    columns = DeviceColumns(["0", "1", "2"], [None] * 3, [0, 1, 2], [None] * 3, [0, 1, 1, 3])
    servers = servers_from_device_columns(
        ["a", "b", "c"], [0, 1, 2], columns, [None] * 3, [None] * 3, [None] * 3, [None] * 3
    )
    table = RankTable("1.0", "completed", tuple(servers))
    assert table.device_counts == (1, 0, 2) == tuple(len(s.devices) for s in servers)
