"""Generated clusters: a realistic rank table and switch topology from a few numbers (pure).

Used by the benchmarks, the tests, the bootstrap benchmark and the demo. Everything is a function
of the arguments (``random.Random(seed)``), so the same call gives the same cluster everywhere.

What "realistic" means here:

* Server ids are host IPs, scattered over a few /16 subnets so that numeric and string order of ids
  differ (``10.3.0.9`` vs ``10.3.0.10``) and ids say nothing about the switch a node hangs off.
* ToRs are switch IPs (``172.16.<g>.<t>``); each ToR has ``slots_per_tor`` server slots and the
  job occupies a subset of them (``slot`` = MindCluster ``slice_id``).
* ``occupancy="even"`` spreads the nodes as evenly as possible over the ToRs; ``"uneven"`` draws
  skewed ToR sizes (every ToR keeps at least one node), as a busy cluster leaves them;
  ``tor_sizes`` gives the size of every ToR instead (the fabric benchmark's ``16:6,4,4,2``).
* The scheduler's pod order is, with ``scatter=True``, a seeded shuffle: Volcano binds pods in
  whatever order nodes become free, so pod index says nothing about placement.
* Devices follow the v1.0 rank table: ``device_id`` 0..npus-1, a unique ``device_ip``, and
  ``rank_id = pod_index * npus_per_node + position``; ``pod_name`` is ``<job>-worker-<index>``.
* ``missing_topology`` nodes have no topology entry; ``multi_tor`` nodes have NICs on two ToRs
  (their own and the next one); ``spine_groups``/``super_pods`` add outer tiers (ToRs are split
  into that many contiguous groups); ``partial_nodes`` servers list only half the NPUs.
"""

from __future__ import annotations

import random
from typing import Dict, List, Optional, Sequence, Tuple

from npu_job.bootstrap.base.model import Device, Placement, RankTable, Server, Topology

OCCUPANCIES = ("even", "uneven")


def synthetic_cluster(
    nodes: int,
    tors: int,
    *,
    npus_per_node: int = 8,
    seed: int = 0,
    occupancy: str = "even",
    missing_topology: int = 0,
    multi_tor: int = 0,
    spine_groups: int = 0,
    super_pods: int = 0,
    scatter: bool = True,
    slots_per_tor: Optional[int] = None,
    partial_nodes: int = 0,
    job_name: str = "job",
    status: str = "completed",
    tor_sizes: Optional[Sequence[int]] = None,
) -> Tuple[RankTable, Topology]:
    """A ``nodes``-node job spread over ``tors`` ToR switches: ``(rank_table, topology)``.

    Raises ``ValueError`` for impossible requests (more ToRs than nodes, more missing or multi-ToR
    nodes than nodes, an unknown occupancy, ...): these are programming errors of the caller.
    """
    if nodes < 1 or tors < 1 or tors > nodes:
        raise ValueError(f"need 1 <= tors <= nodes, got nodes={nodes}, tors={tors}")
    if occupancy not in OCCUPANCIES:
        raise ValueError(f"occupancy must be one of {OCCUPANCIES}, got {occupancy!r}")
    for name, value in (
        ("missing_topology", missing_topology),
        ("multi_tor", multi_tor),
        ("partial_nodes", partial_nodes),
    ):
        if not 0 <= value <= nodes:
            raise ValueError(f"{name} must be within 0..{nodes}, got {value}")
    if multi_tor and tors < 2:
        raise ValueError("multi_tor nodes need at least 2 ToRs")
    for name, value in (("spine_groups", spine_groups), ("super_pods", super_pods)):
        if not 0 <= value <= tors:
            raise ValueError(f"{name} must be within 0..{tors}, got {value}")
    if tor_sizes is not None and (
        len(tor_sizes) != tors or sum(tor_sizes) != nodes or min(tor_sizes, default=0) < 1
    ):
        raise ValueError(
            f"tor_sizes must be {tors} sizes of at least 1 adding up to {nodes}, got {tor_sizes}"
        )
    rng = random.Random(seed)

    sizes = list(tor_sizes) if tor_sizes is not None else _tor_sizes(nodes, tors, occupancy, rng)
    capacity = slots_per_tor if slots_per_tor is not None else max(sizes) + max(1, max(sizes) // 4)
    if capacity < max(sizes):
        raise ValueError(f"slots_per_tor={capacity} is smaller than the fullest ToR ({max(sizes)})")
    tor_ids = [f"172.16.{index // 250}.{index % 250 + 1}" for index in range(tors)]

    # (tor index, slot) for every node, in switch order; then ids and the scheduler's order.
    seats: List[Tuple[int, int]] = []
    for tor, size in enumerate(sizes):
        seats.extend((tor, slot) for slot in sorted(rng.sample(range(capacity), size)))
    server_ids = _host_ips(nodes, rng)
    pod_order = list(range(nodes))
    if scatter:
        rng.shuffle(pod_order)  # pod_order[pod_index] = seat index

    without = set(rng.sample(range(nodes), missing_topology))
    with_two = set(
        rng.sample(sorted(set(range(nodes)) - without), min(multi_tor, nodes - len(without)))
    )
    shorts = set(rng.sample(range(nodes), partial_nodes))

    placements: Dict[str, Placement] = {}
    servers: List[Server] = []
    device_octet = 0
    for pod_index, seat in enumerate(pod_order):
        tor, slot = seats[seat]
        server_id = server_ids[seat]
        if seat not in without:
            tor_set = (tor_ids[tor],)
            if seat in with_two:
                tor_set += (tor_ids[(tor + 1) % tors],)
            placements[server_id] = Placement(
                tiers=_tiers(tor, tors, super_pods, spine_groups), tors=tor_set, slot=slot
            )
        count = npus_per_node // 2 if pod_index in shorts else npus_per_node
        devices = []
        for position in range(count):
            device_octet += 1
            devices.append(
                Device(
                    device_id=str(position),
                    device_ip="29." + ".".join(str(device_octet >> s & 255) for s in (16, 8, 0)),
                    rank_id=pod_index * npus_per_node + position,
                )
            )
        servers.append(
            Server(
                server_id=server_id,
                pod_index=pod_index,
                devices=tuple(devices),
                host_ip=server_id,
                container_ip=f"192.{168 + pod_index // 62500}.{pod_index % 62500 // 250}."
                f"{pod_index % 250 + 1}",
                pod_name=f"{job_name}-worker-{pod_index}",
            )
        )
    table = RankTable(version="1.0", status=status, servers=tuple(servers))
    return table, Topology(placements, source="synthetic")


def _tor_sizes(nodes: int, tors: int, occupancy: str, rng: random.Random) -> List[int]:
    if occupancy == "even":
        return [nodes // tors + (1 if index < nodes % tors else 0) for index in range(tors)]
    # Skewed: one node per ToR, the rest by weights from a heavy-tailed draw.
    weights = [rng.paretovariate(1.2) for _ in range(tors)]
    sizes = [1] * tors
    for _ in range(nodes - tors):
        sizes[rng.choices(range(tors), weights)[0]] += 1
    return sizes


def _host_ips(count: int, rng: random.Random) -> List[str]:
    """``count`` distinct host IPs over a few subnets, in random order."""
    subnets = max(1, (count + 199) // 200)
    pool = [  # 250 hosts per subnet 10.<1..255>.<0..>.0/24: canonical addresses up to 16M hosts
        f"10.{subnet % 255 + 1}.{subnet // 255}.{host + 1}"
        for subnet in range(subnets)
        for host in range(250)
    ]
    return rng.sample(pool, count)


def _tiers(tor: int, tors: int, super_pods: int, spine_groups: int) -> Tuple[str, ...]:
    tiers: List[str] = []
    if super_pods:
        tiers.append(f"superpod-{tor * super_pods // tors}")
    if spine_groups:
        tiers.append(f"spine-{tor * spine_groups // tors}")
    return tuple(tiers)
