"""The planner: switch-contiguous by default, RHD-aware, deterministic, identity when it cannot."""

from __future__ import annotations

import dataclasses
import random
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from npu_job.bootstrap import canonical, scorer
from npu_job.bootstrap.base.model import (
    Collective,
    Device,
    Placement,
    Plan,
    PlanStatus,
    RankTable,
    Server,
    Topology,
)
from npu_job.bootstrap.planner import bit_reversed, interleave, plan
from npu_job.demo.synthetic import synthetic_cluster

PROPERTY_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def make_table(
    server_ids: Sequence[str], devices: Optional[Sequence[int]] = None, status: str = "completed"
) -> RankTable:
    counts = devices if devices is not None else [8] * len(server_ids)
    servers = tuple(
        Server(
            server_id=sid,
            pod_index=index,
            devices=tuple(Device(str(d), f"29.0.{index}.{d}", index * 8 + d) for d in range(count)),
        )
        for index, (sid, count) in enumerate(zip(server_ids, counts))
    )
    return RankTable(version="1.0", status=status, servers=servers)


def order_of(result) -> Tuple[int, ...]:
    return result.pod_of_node_rank


clusters = st.builds(
    lambda nodes, tors_wanted, seed, occupancy, missing, multi, spines: synthetic_cluster(
        nodes,
        max(1, min(tors_wanted, nodes)),
        seed=seed,
        occupancy=occupancy,
        missing_topology=min(missing, nodes - 1),
        multi_tor=multi if min(tors_wanted, nodes) > 1 else 0,
        spine_groups=min(spines, max(1, min(tors_wanted, nodes))),
    ),
    nodes=st.integers(3, 48),
    tors_wanted=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    occupancy=st.sampled_from(["even", "uneven"]),
    missing=st.integers(0, 3),
    multi=st.integers(0, 2),
    spines=st.integers(0, 3),
)


# --- the default (ring / NHR) order ---------------------------------------------------------------


def test_small_cluster_is_sorted_by_tor_then_slot_then_numeric_ip_with_unplaced_last():
    ids = ["10.0.0.10", "10.0.0.9", "10.0.1.1", "10.0.0.100", "10.0.0.2", "10.0.0.3", "10.0.0.50"]
    table = make_table(ids)
    topology = Topology(
        {
            "10.0.0.10": Placement(tors=("172.16.0.10",)),  # numerically after ToR .9
            "10.0.0.9": Placement(tors=("172.16.0.9",), slot=1),
            "10.0.1.1": Placement(tors=("172.16.0.9",), slot=0),
            "10.0.0.100": Placement(tors=("172.16.0.10",)),
            "10.0.0.2": Placement(tors=("172.16.0.9", "172.16.0.10")),  # bridges both ToRs
            # 10.0.0.3 and 10.0.0.50: no topology -> last, by numeric id
        }
    )
    result = plan(table, topology)
    assert result.status is PlanStatus.SUCCESS
    assert [ids[pod] for pod in order_of(result)] == [
        "10.0.1.1",
        "10.0.0.9",  # ToR .9, by slot (not by id)
        "10.0.0.2",  # the (.9, .10) pair sorts right after ToR .9
        "10.0.0.10",
        "10.0.0.100",  # ToR .10, no slots: by numeric id
        "10.0.0.3",
        "10.0.0.50",  # no topology: singletons by numeric id
    ]
    assert result.master_index == ids.index("10.0.1.1")
    assert any("2 of 7 servers have no topology entry" in note for note in result.reasons)


def test_known_slots_come_before_unknown_slots_within_a_tor():
    table = make_table(["h1", "h2", "h3"])
    topology = Topology(
        {
            "h1": Placement(tors=("t",)),
            "h2": Placement(tors=("t",), slot=5),
            "h3": Placement(tors=("t",), slot=0),
        }
    )
    assert [table.servers[p].server_id for p in order_of(plan(table, topology))] == [
        "h3",
        "h2",
        "h1",
    ]


def test_super_pod_from_the_rank_table_is_the_outermost_tier():
    table = make_table(["a", "b", "c", "d"])
    servers = tuple(
        dataclasses.replace(s, super_pod_id=sp)
        for s, sp in zip(table.servers, ["1", "0", "1", "0"])
    )
    table = dataclasses.replace(table, servers=servers)
    topology = Topology(
        {sid: Placement(tors=(tor,)) for sid, tor in zip("abcd", ["t0", "t9", "t0", "t9"])}
    )
    # super pod 0 (b, d on t9) before super pod 1 (a, c on t0), although t0 < t9
    assert [table.servers[p].server_id for p in order_of(plan(table, topology))] == [
        "b",
        "d",
        "a",
        "c",
    ]


def test_super_pods_alone_are_enough_to_plan():
    table = make_table(["a", "b", "c"])
    table = dataclasses.replace(
        table,
        servers=tuple(
            dataclasses.replace(s, super_pod_id=sp) for s, sp in zip(table.servers, ["2", "1", "2"])
        ),
    )
    result = plan(table, None)
    assert result.status is PlanStatus.SUCCESS
    assert [table.servers[p].server_id for p in order_of(result)] == ["b", "a", "c"]


@PROPERTY_SETTINGS
@given(cluster=clusters)
def test_plan_is_a_permutation_with_each_switch_group_contiguous_and_the_ring_bound_reached(
    cluster,
):
    table, topology = cluster
    result = plan(table, topology)
    assert result.status is PlanStatus.SUCCESS
    assert sorted(result.node_rank_of_pod) == list(range(table.node_count))
    keys = scorer.switch_keys(table, topology)
    order = order_of(result)
    seen_labels: List[Tuple[str, ...]] = []
    for pod in order:
        if not seen_labels or seen_labels[-1] != keys[pod]:
            assert keys[pod] not in seen_labels, f"switch group {keys[pod]} is split"
            seen_labels.append(keys[pod])
    score = scorer.score_order(order, keys, samples=0)
    assert score.ring_cross_edges == score.ring_lower_bound
    assert score.ring_cross_edges_by_tier == score.ring_lower_bound_by_tier
    # the planner hands its order and mapping to the plan's caches: what the fields alone give
    fresh = Plan(result.status, result.node_rank_of_pod, result.collective)
    assert (result.pod_of_node_rank, result.rank_mapping) == (
        fresh.pod_of_node_rank,
        fresh.rank_mapping,
    )
    assert result.mapping_digest == canonical.mapping_digest(fresh.rank_mapping)


@PROPERTY_SETTINGS
@given(
    cluster=clusters,
    shuffle_seed=st.integers(0, 2**16),
    collective=st.sampled_from(list(Collective)),
)
def test_the_same_cluster_in_any_input_order_gets_the_same_ranks_per_server(
    cluster, shuffle_seed, collective
):
    table, topology = cluster
    rng = random.Random(shuffle_seed)
    servers = list(table.servers)
    rng.shuffle(servers)  # another pod order: the same machines, scheduled differently
    reordered = tuple(
        dataclasses.replace(
            server, pod_index=index, devices=tuple(rng.sample(server.devices, len(server.devices)))
        )
        for index, server in enumerate(servers)
    )
    items = list(topology.placements.items())
    rng.shuffle(items)
    shuffled_topology = Topology(
        {
            sid: Placement(tiers=p.tiers, tors=tuple(rng.sample(p.tors, len(p.tors))), slot=p.slot)
            for sid, p in items
        },
        source=topology.source,
    )
    first = plan(table, topology, collective)
    second = plan(dataclasses.replace(table, servers=reordered), shuffled_topology, collective)

    def by_server(result, t: RankTable) -> Dict[str, int]:
        return {server.server_id: rank for server, rank in zip(t.servers, result.node_rank_of_pod)}

    assert by_server(first, table) == by_server(
        second, dataclasses.replace(table, servers=reordered)
    )


@PROPERTY_SETTINGS
@given(cluster=clusters, shuffle_seed=st.integers(0, 2**16))
def test_digests_ignore_device_order_and_topology_order_but_not_the_collective(
    cluster, shuffle_seed
):
    table, topology = cluster
    rng = random.Random(shuffle_seed)
    shuffled_devices = dataclasses.replace(
        table,
        servers=tuple(
            dataclasses.replace(s, devices=tuple(rng.sample(s.devices, len(s.devices))))
            for s in table.servers
        ),
    )
    items = list(topology.placements.items())
    rng.shuffle(items)
    first = plan(table, topology)
    again = plan(shuffled_devices, Topology(dict(items), source="other"))
    assert (first.input_digest, first.mapping_digest) == (again.input_digest, again.mapping_digest)
    assert len(first.input_digest) == 64 and len(first.mapping_digest) == 64
    assert plan(table, topology, Collective.NHR).input_digest != first.input_digest


def test_digests_are_pinned_for_a_fixed_cluster():
    """Every pod (any Python >= 3.9, any platform) must log these exact digests for this input."""
    table, topology = synthetic_cluster(12, 3, seed=7, missing_topology=1, multi_tor=1)
    result = plan(table, topology)
    assert result.input_digest == canonical.input_digest(table, topology, Collective.RING)
    assert result.mapping_digest == canonical.mapping_digest(result.rank_mapping)
    assert result.rank_mapping == plan(table, topology).rank_mapping


# --- halving-doubling -----------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(tor_bits=st.integers(1, 3), size_bits=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_rhd_first_and_largest_step_stays_inside_a_tor_for_even_power_of_two_tors(
    tor_bits, size_bits, seed
):
    tors, size = 1 << tor_bits, 1 << size_bits
    table, topology = synthetic_cluster(tors * size, tors, seed=seed)
    result = plan(table, topology, Collective.RHD)
    keys = scorer.switch_keys(table, topology)
    order = order_of(result)
    first = scorer.phases(len(order), Collective.RHD)[0]
    assert first.label == f"rhd d={len(order) // 2}"
    assert all(keys[order[src]] == keys[order[dst]] for src, dst in first.flows)


@PROPERTY_SETTINGS
@given(cluster=clusters)
def test_rhd_choice_never_moves_more_data_across_tors_than_the_contiguous_order(cluster):
    table, topology = cluster
    keys = scorer.switch_keys(table, topology)
    rhd = scorer.cross_switch_volume(
        order_of(plan(table, topology, Collective.RHD)), keys, Collective.RHD
    )
    contiguous = scorer.cross_switch_volume(order_of(plan(table, topology)), keys, Collective.RHD)
    assert rhd <= contiguous


def test_interleave_deals_one_node_per_group_and_skips_empty_groups():
    assert interleave([(0, 1, 2), (3, 4, 5)]) == (0, 3, 1, 4, 2, 5)  # rank = slot * T + tor
    assert interleave([(0, 1, 2), (3,), (4, 5)]) == (0, 3, 4, 1, 5, 2)


def test_bit_reversed_puts_contiguous_neighbours_at_xor_n_over_2():
    assert bit_reversed(list("abcdefgh")) == tuple("aecgbfdh")
    order = bit_reversed(list(range(6)))  # 6 = 4 survivors + 2 folded pairs
    assert sorted(order) == list(range(6))
    # fold pairs (ranks 0,1) and (2,3) hold contiguous neighbours
    assert {order[0], order[1]} in ({0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5})


# --- preconditions: identity with the reason ------------------------------------------------------

FOUR = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
PLACED = Topology({sid: Placement(tors=(f"t{i % 2}",)) for i, sid in enumerate(FOUR)})


@pytest.mark.parametrize(
    ("table", "topology", "kwargs", "reason"),
    [
        (make_table(FOUR[:2]), PLACED, {}, "only 2 node(s); reordering needs at least 3"),
        (make_table([]), PLACED, {}, "only 0 node(s)"),
        (
            make_table(FOUR, devices=[8, 8, 4, 8]),
            PLACED,
            {},
            "partial nodes: device counts differ (8 on 3, 4 on 1; short: '10.0.0.3')",
        ),
        (
            make_table(FOUR, devices=[8, 0, 8, 8]),
            PLACED,
            {},
            "partial nodes: 1 server(s) list no devices ('10.0.0.2')",
        ),
        (
            make_table(FOUR, devices=[4, 4, 4, 4]),
            PLACED,
            {"full_node_devices": 8},
            "do not have the full 8 devices",
        ),
        (make_table(FOUR), None, {}, "no switch topology available"),
        (make_table(FOUR), Topology({}), {}, "no switch topology available"),
        (
            make_table(FOUR),
            Topology({"node-1": Placement(tors=("t",))}, source="file"),
            {},
            "topology (file) has no entry for any of the 4 servers",
        ),
        (
            make_table(FOUR, status="initializing"),
            PLACED,
            {},
            "status is 'initializing', not 'completed'",
        ),
        (
            make_table(FOUR[:3] + FOUR[:1]),
            PLACED,
            {},
            "duplicate server_id '10.0.0.1' (pod indices 0 and 3)",
        ),
    ],
    ids=[
        "two-nodes",
        "no-nodes",
        "partial-node",
        "node-without-devices",
        "not-full-nodes",
        "no-topology",
        "empty-topology",
        "topology-ids-do-not-match",
        "not-completed",
        "duplicate-server-id",
    ],
)
def test_cannot_plan_gives_the_identity_with_the_reason(table, topology, kwargs, reason):
    result = plan(table, topology, **kwargs)
    assert result.status is PlanStatus.FAILED
    assert result.is_identity and result.master_index == 0
    assert any(reason in line for line in result.reasons), result.reasons
    assert len(result.input_digest) == 64 and result.mapping_digest == canonical.mapping_digest(
        result.rank_mapping
    )


def test_pod_indices_out_of_order_are_refused():
    table = make_table(FOUR)
    swapped = (table.servers[1], table.servers[0]) + table.servers[2:]
    result = plan(dataclasses.replace(table, servers=swapped), PLACED)
    assert (
        result.status is PlanStatus.FAILED and "pod indices are not 0..3 in order" in result.reasons
    )


def test_every_reason_is_reported_at_once():
    result = plan(make_table(FOUR[:2], devices=[8, 4], status="initializing"), None)
    assert len(result.reasons) == 4


# --- every pod plans alone: start-up cost and the hash seed ---------------------------------------


def test_planning_an_ipv4_cluster_loads_no_heavy_module():
    """The pod-side start-up budget: hashlib (OpenSSL), socket, requests, yaml and msgspec (loaded
    only for big inputs) stay unloaded on the common path (IPv4 ids, local files). (Not ipaddress:
    pathlib's urllib may load it.)"""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from npu_job.bootstrap import run, planner, writers, wait, identity, topology, ranktable\n"
        "from npu_job.bootstrap.base.model import Collective, Device, Placement, RankTable, Server, Topology\n"
        "servers = tuple(Server(f'10.0.0.{i}', i, (Device('0', rank_id=i),)) for i in range(4))\n"
        "tors = Topology({f'10.0.0.{i}': Placement(tors=(f'172.16.0.{i % 2}',)) for i in range(4)})\n"
        "result = planner.plan(RankTable('1.0', 'completed', servers), tors, Collective.RHD)\n"
        "assert result.status.value == 'success', result\n"
        "heavy = ('hashlib', 'socket', 'requests', 'yaml', 'torch', 'msgspec')\n"
        "print(','.join(name for name in heavy if name in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_process_computes_the_same_plan_whatever_its_hash_seed():
    """Pods are separate interpreters: set/dict/hash() order must not leak into the plan."""
    import os
    import subprocess
    import sys

    code = (
        "from npu_job.demo.synthetic import synthetic_cluster\n"
        "from npu_job.bootstrap.base.model import Collective, Placement, Topology\n"
        "from npu_job.bootstrap.planner import plan\n"
        "table, topology = synthetic_cluster(\n"
        "    60, 7, seed=11, occupancy='uneven', missing_topology=3, multi_tor=4)\n"
        "def renamed(p):\n"
        "    tors = tuple('tor-' + t.replace('.', '') for t in p.tors)\n"
        "    return Placement(tiers=('spine-' + p.tors[0][-1],), tors=tors, slot=p.slot)\n"
        "named = Topology({sid: renamed(p) for sid, p in topology.placements.items()})\n"
        "for collective in Collective:\n"
        "    result = plan(table, named, collective)\n"
        "    print(result.rank_mapping, result.input_digest, result.mapping_digest)\n"
    )
    outputs = set()
    for hash_seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1
