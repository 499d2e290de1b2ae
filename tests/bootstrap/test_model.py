"""The domain model: plans are permutations and say where rank 0 went."""

import copy
import dataclasses
import inspect
import pickle

import pytest
from npu_job.bootstrap.columns import (
    DeviceColumns,
    devices_from_columns,
    servers_from_columns,
    servers_from_device_columns,
)
from npu_job.bootstrap.model import (
    Collective,
    Device,
    Placement,
    Plan,
    PlanStatus,
    RankTable,
    Server,
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


@pytest.mark.parametrize("ranks", [(0, 0, 1), (1, 2), (0, 2)], ids=["duplicate", "no-zero", "gap"])
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


def test_column_builders_make_the_same_frozen_objects_as_the_constructors():
    columns = (["0", "1"], ["29.0.0.1", None], [0, 1], [None, "sd-1"])
    built = devices_from_columns(*columns)
    assert built == [Device(*row) for row in zip(*columns)]
    assert [repr(d) for d in built] == [repr(Device(*row)) for row in zip(*columns)]
    assert [hash(d) for d in built] == [hash(Device(*row)) for row in zip(*columns)]
    assert pickle.loads(pickle.dumps(built)) == built
    server_columns = (["10.0.0.1"], [0], [tuple(built)], ["10.0.0.1"], [None], ["w-0"], ["sp"])
    servers = servers_from_columns(*server_columns)
    assert servers == [Server(*row) for row in zip(*server_columns)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        built[0].rank_id = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        servers[0].pod_index = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "cls, builder",
    [(Device, devices_from_columns), (Server, servers_from_columns)],
    ids=["Device", "Server"],
)
def test_column_builders_cover_every_field_and_nothing_they_skip(cls, builder):
    """The builders bypass __init__: one column per field (the test above checks each lands in
    its field), and no __post_init__ or default factory that __init__ would have run."""
    assert len(inspect.signature(builder).parameters) == len(dataclasses.fields(cls))
    assert not hasattr(cls, "__post_init__")
    assert all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(cls))


@pytest.mark.parametrize("offsets", [range(0, 5, 2), [0, 3, 4]], ids=["equal-counts", "uneven"])
def test_servers_with_device_columns_equal_servers_built_with_their_devices(offsets):
    columns = DeviceColumns(
        ["0", "1", "2", "3"],
        ["29.0.0.1", None, "29.0.0.3", None],
        [0, 1, 2, 3],
        [None, "sd-1", None, None],
        offsets,
    )
    server_columns = (
        ["10.0.0.1", "10.0.0.2"],
        [0, 1],
        ["10.0.0.1", None],
        [None, "c"],
        ["w-0", None],
        ["sp", None],
    )
    lazy = servers_from_device_columns(
        server_columns[0], server_columns[1], columns, *server_columns[2:]
    )
    eager = [
        Server(sid, pod, columns.devices_of(pod), *rest) for sid, pod, *rest in zip(*server_columns)
    ]
    assert [s.device_count for s in lazy] == [offsets[1] - offsets[0], offsets[2] - offsets[1]]
    assert all("devices" not in vars(s) for s in lazy)  # counting builds no Device
    assert pickle.loads(pickle.dumps(lazy)) == eager
    assert [copy.copy(s) for s in lazy] == eager
    assert lazy == eager
    assert [hash(s) for s in lazy] == [hash(s) for s in eager]
    assert [repr(s) for s in lazy] == [repr(s) for s in eager]
    assert [s.devices for s in lazy] == [s.devices for s in eager]
    assert lazy[0].devices is lazy[0].devices  # built once
    assert [s.device_count for s in eager] == [s.device_count for s in lazy]
    assert dataclasses.replace(lazy[1], pod_index=5) == dataclasses.replace(eager[1], pod_index=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy[0].devices = ()  # type: ignore[misc]


def test_device_column_builder_takes_one_column_per_server_field():
    assert len(inspect.signature(servers_from_device_columns).parameters) == len(
        dataclasses.fields(Server)
    )
    assert not hasattr(Server, "devices")  # a field without a default, as before


def test_rank_table_device_counts_are_the_servers_device_counts_in_pod_order():
    columns = DeviceColumns(["0", "1", "2"], [None] * 3, [0, 1, 2], [None] * 3, [0, 1, 1, 3])
    servers = servers_from_device_columns(
        ["a", "b", "c"], [0, 1, 2], columns, [None] * 3, [None] * 3, [None] * 3, [None] * 3
    )
    table = RankTable("1.0", "completed", tuple(servers))
    assert table.device_counts == (1, 0, 2) == tuple(len(s.devices) for s in servers)
