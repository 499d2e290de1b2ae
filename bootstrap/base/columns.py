"""Building many :class:`~.model.Server` and ``Device`` objects fast, from columns.

A rank table of 4096 nodes has 32k devices, and a frozen dataclass's ``__init__`` stores every
field through ``object.__setattr__`` (its frozen guard), which is most of the cost of building
them. The builders here take already validated columns (one sequence per field) and write the
same fields into each new instance's ``__dict__`` directly, the way ``pickle`` and ``copy`` restore
a frozen dataclass: the results are indistinguishable from the constructors' (equality, hash,
repr, immutability), about 2.5x faster. :class:`DeviceColumns` goes further: servers made by
:func:`servers_from_device_columns` build their devices only when first read (bootstrapping reads
only how many each server has). ``tests/bootstrap/test_columns.py`` holds the field lists here to
the dataclasses'.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Iterable, List, Optional, Sequence, Tuple

from .model import Device, Server


def devices_from_columns(
    device_ids: Sequence[str],
    device_ips: Iterable[Optional[str]],
    rank_ids: Iterable[Optional[int]],
    super_device_ids: Iterable[Optional[str]],
) -> List[Device]:
    """``[Device(*row) for row in zip(...)]`` for already validated columns (see the module
    docstring). Valid because :class:`Device` has no ``__post_init__`` and no default factories."""
    devices = list(map(object.__new__, repeat(Device, len(device_ids))))
    for state, device_id, device_ip, rank_id, super_device_id in zip(
        map(vars, devices), device_ids, device_ips, rank_ids, super_device_ids
    ):
        state["device_id"] = device_id
        state["device_ip"] = device_ip
        state["rank_id"] = rank_id
        state["super_device_id"] = super_device_id
    return devices


def servers_from_columns(
    server_ids: Sequence[str],
    pod_indices: Iterable[int],
    devices: Iterable[Tuple[Device, ...]],
    host_ips: Iterable[Optional[str]],
    container_ips: Iterable[Optional[str]],
    pod_names: Iterable[Optional[str]],
    super_pod_ids: Iterable[Optional[str]],
) -> List[Server]:
    """``[Server(*row) for row in zip(...)]`` for already validated columns; see
    :func:`devices_from_columns` for why and why it is the same (:class:`Server` has no
    ``__post_init__`` either)."""
    servers = list(map(object.__new__, repeat(Server, len(server_ids))))
    # One name per column, not ``*row``: unpacking into a list costs a fifth of the loop.
    for state, server_id, pod_index, devices_of, host_ip, container_ip, pod_name, super_pod in zip(
        map(vars, servers),
        server_ids,
        pod_indices,
        devices,
        host_ips,
        container_ips,
        pod_names,
        super_pod_ids,
    ):
        state["server_id"] = server_id
        state["pod_index"] = pod_index
        state["devices"] = devices_of
        state["host_ip"] = host_ip
        state["container_ip"] = container_ip
        state["pod_name"] = pod_name
        state["super_pod_id"] = super_pod
    return servers


@dataclass(frozen=True, eq=False)
class DeviceColumns:
    """The devices of a run of servers as flat, already validated columns, one row per device.

    Server ``i``'s devices are rows ``offsets[i]:offsets[i + 1]``. A 4096-node table has 32k
    devices, and bootstrapping reads only how many each server has: servers made with
    :func:`servers_from_device_columns` build their :class:`Device` objects on first access.
    """

    device_ids: Sequence[str]
    device_ips: Sequence[Optional[str]]
    rank_ids: Sequence[Optional[int]]
    super_device_ids: Sequence[Optional[str]]
    offsets: Sequence[int]  # len(servers) + 1 entries, offsets[0] == 0

    def count_of(self, position: int) -> int:
        return self.offsets[position + 1] - self.offsets[position]

    def devices_of(self, position: int) -> Tuple[Device, ...]:
        start, stop = self.offsets[position], self.offsets[position + 1]
        return tuple(
            devices_from_columns(
                self.device_ids[start:stop],
                self.device_ips[start:stop],
                self.rank_ids[start:stop],
                self.super_device_ids[start:stop],
            )
        )


def servers_from_device_columns(
    server_ids: Sequence[str],
    pod_indices: Iterable[int],
    devices: DeviceColumns,
    host_ips: Iterable[Optional[str]],
    container_ips: Iterable[Optional[str]],
    pod_names: Iterable[Optional[str]],
    super_pod_ids: Iterable[Optional[str]],
) -> List[Server]:
    """:func:`servers_from_columns` where server ``i`` gets ``devices.devices_of(i)``, built only
    when first read (``device_count`` never builds them): equal, in every field, to the servers
    :func:`servers_from_columns` makes from the materialised device tuples."""
    servers = servers_from_columns(
        server_ids, pod_indices, repeat(()), host_ips, container_ips, pod_names, super_pod_ids
    )
    for position, state in enumerate(map(vars, servers)):
        del state["devices"]  # so that _DevicesFromColumns answers, from the columns
        state["_device_rows"] = (devices, position)
    return servers
