"""The column builders: servers and devices built from columns, or with their devices built on
first read, are indistinguishable from the ones the dataclasses' constructors make."""

import copy
import dataclasses
import inspect
import pickle

import pytest
from npu_job.bootstrap.base.columns import (
    DeviceColumns,
    devices_from_columns,
    servers_from_columns,
    servers_from_device_columns,
)
from npu_job.bootstrap.base.model import Device, Server


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
