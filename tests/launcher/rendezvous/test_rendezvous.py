"""The ``parallel`` rendezvous backend, driven in-process: real TCPStore root, real StoreProxy.

Each "node" is a handler in its own thread, as torch's agent would drive it; nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import logging
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
from npu_job.bootstrap.base.model import Placement
from npu_job.bootstrap.nodereport import NodeReport, encode_report, plan_round
from npu_job.launcher import torchcompat
from npu_job.launcher.rendezvous import handler as backend
from npu_job.launcher.rendezvous import rootstore, rounds
from npu_job.launcher.rendezvous.handler import ParallelRendezvousHandler, ParallelSettings
from npu_job.launcher.rendezvous.watch import JobStopped
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from npu_job.errors import LaunchError
from tests.machine_stalls import rerun_after_machine_stall

from ..cluster import free_port, port_is_free, wait_for
from ..torch_features import Joined, joined

# A liveness window of 5 s (a heartbeat every 0.2 s, 25 missed before a node counts as gone), for
# tests in which a node's own word, not its missing heartbeat, must stop the others. A machine
# stalled for the window less one beat hides every live node's beats and can stop them first.
BEAT, BEATS_MISSED = 0.2, 25
stalls_hide_the_beats = rerun_after_machine_stall(longer_than=BEAT * (BEATS_MISSED - 1))


def make_handlers(
    nnodes: int, ranks: Sequence[int], **overrides
) -> Dict[int, ParallelRendezvousHandler]:
    port = free_port()
    options = dict(join_timeout=10.0, close_timeout=5.0, store_timeout=10.0, watch_interval=0.01)
    options.update(overrides)
    return {
        rank: ParallelRendezvousHandler(
            ParallelSettings(
                run_id="job",
                master_addr="127.0.0.1",
                master_port=port,
                node_rank=rank,
                nnodes=nnodes,
                **options,
            )
        )
        for rank in ranks
    }


def join_all(handlers: Sequence[ParallelRendezvousHandler]) -> List:
    """Call next_rendezvous on every handler concurrently; results or exceptions, in order."""

    def attempt(handler):
        try:
            return handler.next_rendezvous()
        except Exception as error:  # returned, so the test can assert on each node's outcome
            return error

    with ThreadPoolExecutor(len(handlers)) as pool:
        return list(pool.map(attempt, handlers))


@pytest.fixture
def closing():
    opened: List[ParallelRendezvousHandler] = []
    yield opened.extend
    for handler in opened:
        handler.close()


def test_round_keeps_node_ranks_and_points_workers_at_the_root(closing):
    handlers = make_handlers(3, [2, 1, 0])
    closing(handlers.values())
    infos = join_all([handlers[2], handlers[1], handlers[0]])  # the root host arrives last
    nodes = [joined(info) for info in infos]
    workers_ports = {node.master_port for node in nodes}
    for node_rank, node in zip([2, 1, 0], nodes):
        assert (node.rank, node.world_size) == (node_rank, 3)
        assert node.master_addr == "127.0.0.1"
    assert len(workers_ports) == 1  # one store for every node's workers
    if torchcompat.HAS_LIST_KEYS:  # the root itself; else a fresh store per round (torchcompat)
        assert workers_ports == {handlers[0].settings.master_port}
    nodes[0].store.set("from-node-2", "hello")  # the agents share one (prefixed) store
    assert nodes[2].store.get("from-node-2") == b"hello"
    assert all(h.use_agent_store == torchcompat.HAS_LIST_KEYS for h in handlers.values())


def workers_store(node: Joined, hosting: bool) -> TCPStore:
    """The workers' store at ``node``'s address, as a worker opens it: on torch without
    list_keys global rank 0 hosts it (``hosting``), everyone else connects."""
    host = hosting and not torchcompat.HAS_LIST_KEYS
    return TCPStore(
        node.master_addr,
        node.master_port,
        None,
        host,
        datetime.timedelta(seconds=5),
        **({"wait_for_workers": False, "multi_tenant": True} if host else {}),
    )


def test_tiered_round_hands_workers_this_nodes_proxy(closing):
    handlers = make_handlers(2, [0, 1], tiered=True)
    closing(handlers.values())
    nodes = [joined(info) for info in join_all([handlers[0], handlers[1]])]
    root_port = handlers[0].settings.master_port
    proxy_ports = {node.master_port for node in nodes}
    assert {node.master_addr for node in nodes} == {"127.0.0.1"}
    assert len(proxy_ports) == 2 and root_port not in proxy_ports
    direct = workers_store(nodes[0], hosting=True)  # node 0: the root, or rank 0's own store
    if not torchcompat.HAS_LIST_KEYS:
        # node 1 proxies to it
        assert nodes[0].master_port == handlers[1]._faults._proxy_upstream[1]
    via_proxy = workers_store(nodes[1], hosting=False)
    via_proxy.set("worker-key", "through the proxy")
    assert direct.get("worker-key") == b"through the proxy"
    del via_proxy
    handlers[1].close()
    assert port_is_free(nodes[1].master_port)


def test_missing_node_times_out_naming_it(closing):
    handlers = make_handlers(3, [0, 2], join_timeout=1.0)
    closing(handlers.values())
    outcomes = join_all([handlers[0], handlers[2]])
    for outcome in outcomes:
        assert isinstance(outcome, RendezvousTimeoutError), outcome
        assert "missing node ranks [1] of --nnodes=3" in str(outcome)
        assert f"127.0.0.1:{handlers[0].settings.master_port}" in str(outcome)


def test_absent_root_times_out_naming_pod_index_0_and_its_address(closing):
    handlers = make_handlers(2, [1], join_timeout=0.5)
    closing(handlers.values())
    with pytest.raises(
        RendezvousTimeoutError,
        match=r"root store 127\.0\.0\.1:\d+ \(missing its host, pod index 0;",
    ):
        handlers[1].next_rendezvous()


def test_restarting_node_pulls_the_others_into_a_clean_round_with_the_same_ranks(closing):
    handlers = make_handlers(2, [0, 1])
    closing(handlers.values())
    first = [joined(info) for info in join_all([handlers[0], handlers[1]])]
    first[0].store.set("agent-state", "kept")
    old_workers = workers_store(first[0], hosting=True)
    old_workers.set("default_pg/0//cpu/rank_1", "address of a dead worker")  # what workers leave
    assert handlers[0].num_nodes_waiting() == 0

    restarting = ThreadPoolExecutor(1)
    node1_round1 = restarting.submit(handlers[1].next_rendezvous)  # node 1's workers failed
    deadline = time.monotonic() + 5
    while handlers[0].num_nodes_waiting() == 0:
        assert time.monotonic() < deadline, "node 0 never saw node 1 waiting"
        time.sleep(0.02)
    second0 = joined(handlers[0].next_rendezvous())
    second1 = joined(node1_round1.result(timeout=10))
    restarting.shutdown()
    assert (second0.rank, second1.rank) == (0, 1)
    if not torchcompat.HAS_LIST_KEYS:  # the old rank 0 died with its store; a new one on a new port
        del old_workers
        assert second1.master_port != first[1].master_port
    new_workers = workers_store(second0, hosting=True)
    assert not torchcompat.key_exists(new_workers, "default_pg/0//cpu/rank_1")  # no stale key
    if torchcompat.HAS_LIST_KEYS:  # cleared from the root
        assert not any(key.startswith("default_pg/") for key in new_workers.list_keys())
    assert first[1].store.get("agent-state") == b"kept"  # round 0's agent keys are untouched
    assert handlers[0].num_nodes_waiting() == 0


def test_replaced_node_rejoins_a_running_job_in_the_next_round(closing):
    """A pod restarted by the scheduler comes back as a fresh agent with the same node rank."""
    handlers = make_handlers(2, [0, 1])
    replacement = ParallelRendezvousHandler(handlers[1].settings)
    closing([*handlers.values(), replacement])
    join_all([handlers[0], handlers[1]])
    handlers[1].close()  # the old pod is gone

    with ThreadPoolExecutor(1) as pool:
        rejoined = pool.submit(replacement.next_rendezvous)
        deadline = time.monotonic() + 5
        while handlers[0].num_nodes_waiting() == 0:
            assert time.monotonic() < deadline, "node 0 never saw the replacement waiting"
            time.sleep(0.02)
        again = handlers[0].next_rendezvous()
        assert (joined(again).rank, joined(rejoined.result(timeout=10)).rank) == (0, 1)


def test_fresh_agent_waits_out_a_finished_runs_root_and_joins_the_new_one(closing):
    """Pods restarted after a failed run can reach the old node rank 0 agent while it lingers."""
    old = make_handlers(2, [0, 1])
    closing(old.values())
    old_infos = join_all([old[0], old[1]])
    old[1].shutdown()  # the old run is over (node 1 failed and signed off)
    fresh = ParallelRendezvousHandler(old[1].settings)
    closing([fresh])

    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(fresh.next_rendezvous)
        time.sleep(1.0)
        assert not joining.done(), "the fresh agent joined a finished run"
        old[0].close()  # the old node rank 0 agent exits ...
        del old_infos
        gc.collect()
        new_root = ParallelRendezvousHandler(old[0].settings)  # ... and its pod starts a new one
        closing([new_root])
        assert joined(new_root.next_rendezvous()).rank == 0
        assert joined(joining.result(timeout=10)).rank == 1


def test_root_port_held_by_something_else_is_a_launch_error(closing):
    handlers = make_handlers(1, [0], close_timeout=0.2)
    closing(handlers.values())
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", handlers[0].settings.master_port))
        squatter.listen()
        with pytest.raises(LaunchError, match="cannot host the root store on port"):
            handlers[0].next_rendezvous()


def test_closed_rendezvous_refuses_the_next_round(closing):
    handlers = make_handlers(2, [0, 1])
    closing(handlers.values())
    join_all([handlers[0], handlers[1]])
    handlers[1].set_closed()
    assert handlers[0].is_closed()
    with pytest.raises(RendezvousClosedError, match="closed by node rank 1"):
        handlers[0].next_rendezvous()


def test_lost_root_is_reported_with_its_address(closing):
    """Whichever finds the loss first, the caller's own request (a connection error) or the
    heartbeat watch (the job's verdict, raised at the next call), names the root's address."""
    handlers = make_handlers(2, [0, 1])
    closing(handlers.values())
    infos = join_all([handlers[0], handlers[1]])
    port = handlers[0].settings.master_port
    handlers[0].close()
    del infos
    gc.collect()  # the last reference to the root TCPStore server goes: node 0 is gone
    with pytest.raises(
        (RendezvousConnectionError, JobStopped),
        match=rf"lost the root store 127\.0\.0\.1:{port}",
    ):
        for _ in range(50):
            handlers[1].num_nodes_waiting()
            time.sleep(0.02)
    assert handlers[1].shutdown() is False  # nothing to sign off from; no hang, no raise


def test_root_host_keeps_the_root_until_the_other_agents_signed_off(closing):
    """The root's host waits for node 1's sign-off, not for its close_timeout: a minute here, so
    that a stalled machine cannot close the root under node 1 before it signs off."""
    handlers = make_handlers(2, [0, 1], close_timeout=60.0)
    closing(handlers.values())
    join_all([handlers[0], handlers[1]])
    root_done = threading.Event()
    threading.Thread(target=lambda: (handlers[0].shutdown(), root_done.set()), daemon=True).start()
    assert not root_done.wait(0.5), "node 0 closed the root while node 1 was still running"
    assert handlers[1].shutdown() is True
    assert root_done.wait(30), "node 0 still held the root after node 1 signed off"


def test_nodes_that_follow_one_node_order_join(closing):
    handlers = make_handlers(3, [0, 1, 2], node_order="planned order ab12")
    closing(handlers.values())
    assert all(joined(info).world_size == 3 for info in join_all(list(handlers.values())))


def next_or_stopped(handler: ParallelRendezvousHandler):
    try:
        return handler.next_rendezvous()
    except BaseException as error:  # JobStopped unwinds an agent as a BaseException
        return error


def report(pod_index: int, tor: Optional[str], slot: int = 0) -> NodeReport:
    """What pod ``pod_index``'s bootstrap writes: its node, 2 devices, and ``tor`` (None: its
    bootstrap resolved no placement)."""
    return NodeReport(
        node_id=f"10.0.0.{pod_index + 1}",
        pod_index=pod_index,
        pod_name=f"job-worker-{pod_index}",
        device_count=2,
        placement=None if tor is None else Placement(tors=(tor,), slot=slot),
    )


def bootstrap_ranks(reports: Sequence[NodeReport]) -> Tuple[Dict[int, int], str]:
    """The node rank each pod's bootstrap gives it over ``reports``, and the mapping digest
    (plan_round over them: the bootstraps' own ranks, a property of nodereport's tests)."""
    planned = plan_round({str(r.pod_index): encode_report(r) for r in reports})
    return {r.pod_index: planned.node_rank[str(r.pod_index)] for r in reports}, (
        planned.mapping_digest
    )


def pods_with_reports(
    reports: Sequence[NodeReport], hints: Dict[int, int], orders: Dict[int, str], **overrides
) -> Dict[int, ParallelRendezvousHandler]:
    """One handler per report, by pod index: each comes with its bootstrap's rank (``hints``) and
    order, as npu-run passes them from the bootstrap's files."""
    base = next(iter(make_handlers(len(reports), [0], **overrides).values())).settings
    return {
        r.pod_index: ParallelRendezvousHandler(
            dataclasses.replace(
                base,
                node_rank=hints[r.pod_index],
                pod_index=r.pod_index,
                report=encode_report(r),
                node_order=orders[r.pod_index],
            )
        )
        for r in reports
    }


def plan_lines(caplog) -> List[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if re.match(r"round \d+ plan [0-9a-f]+: node rank \d+ of \d+$", record.getMessage())
    ]


def test_pod_index_0_hosts_the_root_and_every_pod_gets_its_bootstraps_rank(closing, caplog):
    """Pod 0 sits on the ToR the order puts last, so its bootstrap gives it node rank 2: it still
    hosts the root (the stable address train.sh points at), and the root's plan over the pods'
    reports gives every pod exactly its bootstrap's rank, with one digest on every node."""
    caplog.set_level(logging.INFO, logger="npu_job")
    reports = [report(0, "tor-b"), report(1, "tor-a", 0), report(2, "tor-a", 1)]
    ranks, digest = bootstrap_ranks(reports)
    assert ranks[0] == 2
    pods = pods_with_reports(reports, ranks, {pod: f"planned order {digest}" for pod in ranks})
    closing(pods.values())
    infos = dict(zip(pods, join_all(list(pods.values()))))
    assert {pod: joined(info).rank for pod, info in infos.items()} == ranks
    assert pods[0]._server is not None
    assert all(pods[pod]._server is None for pod in (1, 2))
    assert sorted(plan_lines(caplog)) == [
        f"round 0 plan {digest}: node rank {rank} of 3" for rank in range(3)
    ]
    assert not any("re-ranked" in record.getMessage() for record in caplog.records)


def test_a_pod_whose_bootstrap_fell_back_is_re_ranked_by_the_root_and_named(closing, caplog):
    """Pod 2's bootstrap could not plan (its report has no placement; its rank is its pod index,
    the scheduler order): where the old backend refused it, the root plans every pod into one
    order and names that pod in one line."""
    caplog.set_level(logging.INFO, logger="npu_job")
    full = [report(0, "tor-b"), report(1, "tor-a", 0), report(2, "tor-a", 1)]
    ranks, digest = bootstrap_ranks(full)
    reports = [*full[:2], report(2, None)]
    hints = {0: ranks[0], 1: ranks[1], 2: 2}
    orders = {0: f"planned order {digest}", 1: f"planned order {digest}", 2: "scheduler order"}
    pods = pods_with_reports(reports, hints, orders)
    closing(pods.values())
    got = {pod: joined(info).rank for pod, info in zip(pods, join_all(list(pods.values())))}
    assert sorted(got.values()) == [0, 1, 2]
    (line,) = [r.getMessage() for r in caplog.records if "re-ranked" in r.getMessage()]
    assert "pod job-worker-2 (its bootstrap did not plan: scheduler order" in line, line
    digests = {message.split()[3] for message in plan_lines(caplog)}
    assert len(digests) == 1 and len(plan_lines(caplog)) == 3


def test_two_nodes_that_come_as_one_node_rank_both_get_a_rank_of_the_plan(closing):
    """Without reports (npu-run by hand), two nodes started with one --node_rank no longer clash:
    the root's plan gives each a rank of its own. One agent more than --nnodes in a round is not
    counted in it."""
    handlers = make_handlers(3, [0, 1])
    second = ParallelRendezvousHandler(handlers[1].settings)
    closing([*handlers.values(), second])
    infos = join_all([handlers[0], handlers[1], second])
    assert sorted(joined(info).rank for info in infos) == [0, 1, 2]
    assert joined(infos[0]).rank == 0
    settings = handlers[0].settings
    client = rootstore.open_client(settings)
    claim = rounds.Claim(1, None, "one-too-many")
    keys = backend.RunKeys(settings.run_id)
    assert rounds.join(client, keys, settings, 0, 99, b"{}", claim) == 0  # no position
    assert b"99" not in client.multi_get([keys.slot(0, p) for p in (1, 2, 3)])
    client.close()


def test_a_replaced_pod_with_another_switch_path_is_planned_into_the_next_round(closing, caplog):
    """Pod 2 is replaced by a pod on another ToR: the fresh agent joins the next round, the others
    restart into it, and the root plans it over the new set: one new digest on every node, the
    ToRs contiguous again; the old agent is no longer watched."""
    caplog.set_level(logging.INFO, logger="npu_job")
    before = [report(0, "tor-a", 0), report(1, "tor-b", 0), report(2, "tor-a", 1)]
    ranks, digest = bootstrap_ranks(before)
    orders = {pod: f"planned order {digest}" for pod in ranks}
    pods = pods_with_reports(before, ranks, orders)
    after = [*before[:2], report(2, "tor-b", 1)]
    new_ranks, new_digest = bootstrap_ranks(after)
    assert new_digest != digest and new_ranks != ranks
    replacement = ParallelRendezvousHandler(
        dataclasses.replace(
            pods[2].settings,
            node_rank=new_ranks[2],
            report=encode_report(after[2]),
            node_order=f"planned order {new_digest}",
        )
    )
    closing([*pods.values(), replacement])
    join_all(list(pods.values()))
    old_member = pods[2].member
    pods[2].close()  # the old pod is gone

    with ThreadPoolExecutor(1) as pool:
        rejoined = pool.submit(replacement.next_rendezvous)
        wait_for(lambda: pods[0].num_nodes_waiting() > 0, 30, "the replacement to wait")
        again = join_all([pods[0], pods[1]])
        got = {0: joined(again[0]).rank, 1: joined(again[1]).rank}
        got[2] = joined(rejoined.result(timeout=30)).rank
    assert got == new_ranks
    round_1 = [line for line in plan_lines(caplog) if line.startswith("round 1 ")]
    assert sorted(round_1) == [
        f"round 1 plan {new_digest}: node rank {rank} of 3" for rank in range(3)
    ]
    watched = pods[0]._faults.watch._tracker.ranks
    assert old_member not in watched and replacement.member in watched


def elastic_handlers(min_nodes: int, max_nodes: int, ranks: Sequence[int], **overrides):
    """Handlers of an elastic job (``--nnodes=MIN:MAX``) whose rounds close after half a second
    of last call."""
    return make_handlers(max_nodes, ranks, min_nodes=min_nodes, last_call=0.5, **overrides)


def test_reports_the_root_cannot_use_are_named_on_every_node_and_the_round_goes_on(closing, caplog):
    """Pods 1 and 2 both report slot 0 under tor-b, and pod 3's report does not decode: every
    node logs one line for each (naming the pods), the round plans the later of the two and the
    malformed one without placement, and all four run it."""
    caplog.set_level(logging.WARNING, logger="npu_job")
    reports = [
        report(0, "tor-a"),
        report(1, "tor-b", 0),
        report(2, "tor-b", 0),
        report(3, "tor-a", 1),
    ]
    ranks = {pod: pod for pod in range(4)}
    pods = pods_with_reports(reports, ranks, {pod: "scheduler order" for pod in range(4)})
    pods[3] = ParallelRendezvousHandler(
        dataclasses.replace(pods[3].settings, report=b'{"node_id": 7')
    )
    closing(pods.values())
    nodes = [joined(info) for info in join_all(list(pods.values()))]
    assert sorted(node.rank for node in nodes) == [0, 1, 2, 3]
    problems = [r.message for r in caplog.records if r.message.startswith("round 0: ")]
    slot = [line for line in problems if "both report slot 0 under" in line]
    malformed = [line for line in problems if ": content: expected JSON (" in line]
    for lines in (slot, malformed):  # one line on each of the four nodes
        assert len(lines) == 4 and len(set(lines)) == 1, problems
        assert lines[0].endswith(" planned without placement")
    assert slot[0].startswith("round 0: pod job-worker-1 and pod job-worker-2 both report slot 0")
    # the malformed report names no pod, so its agent's hostname (a pod's name) does
    hostname = socket.gethostname()
    assert malformed[0].startswith(f"round 0: pod {hostname}: content: expected JSON (")


def test_an_elastic_round_closes_with_the_nodes_there_after_last_call(closing, caplog):
    """--nnodes=2:4 with three agents: the root's host closes the round once no fourth came for
    last_call; all three run it as a world of three, planned over their three reports."""
    caplog.set_level(logging.INFO, logger="npu_job")
    handlers = elastic_handlers(2, 4, [0, 1, 2])
    closing(handlers.values())
    nodes = [joined(info) for info in join_all(list(handlers.values()))]
    assert sorted(node.rank for node in nodes) == [0, 1, 2]
    assert {node.world_size for node in nodes} == {3}
    assert "round 0 closed with 3 node(s)" in caplog.text


def test_an_elastic_round_closes_at_once_with_max_nodes(closing):
    """With MAX agents there the round closes without waiting for last call (a minute here)."""
    handlers = make_handlers(3, [0, 1, 2], min_nodes=1, last_call=60.0)
    closing(handlers.values())
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(join_all, list(handlers.values()))
        nodes = [joined(info) for info in done.result(timeout=30)]
    assert {node.world_size for node in nodes} == {3}


def test_a_node_after_the_close_joins_the_next_round_and_the_members_restart_around_it(
    closing, caplog
):
    """Elastic 2:4: three agents run round 0; a fourth, started later, waits in round 1, the
    members see it waiting and rejoin, and round 1 runs four nodes under one new plan."""
    caplog.set_level(logging.INFO, logger="npu_job")
    handlers = elastic_handlers(2, 4, [0, 1, 2, 3])
    closing(handlers.values())
    first = [joined(info) for info in join_all([handlers[0], handlers[1], handlers[2]])]
    assert {node.world_size for node in first} == {3}
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(handlers[3].next_rendezvous)
        wait_for(lambda: handlers[0].num_nodes_waiting() > 0, 30, "the late node to wait")
        again = [joined(info) for info in join_all([handlers[0], handlers[1], handlers[2]])]
        again.append(joined(late.result(timeout=30)))
    assert sorted(node.rank for node in again) == [0, 1, 2, 3]
    assert {node.world_size for node in again} == {4}
    round_1 = [line for line in plan_lines(caplog) if line.startswith("round 1 ")]
    assert len(round_1) == 4 and len({line.split(":")[0] for line in round_1}) == 1


@stalls_hide_the_beats
def test_an_elastic_job_goes_on_without_a_silent_node_while_min_are_left(closing, caplog):
    """Elastic 2:3 running three nodes: node 2's agent dies (no sign-off, no more heartbeats).
    After the liveness window the root's host names it and lets it go instead of ending the job;
    the others see that as a reason to restart, and their next round runs two nodes."""
    caplog.set_level(logging.INFO, logger="npu_job")
    handlers = elastic_handlers(
        2, 3, [0, 1, 2], keep_alive_interval=BEAT, keep_alive_max_attempt=BEATS_MISSED
    )
    closing(handlers.values())
    assert {joined(info).world_size for info in join_all(list(handlers.values()))} == {3}
    handlers[2].close()  # dead: its watch stops beating, it never signs off
    wait_for(lambda: handlers[1].num_nodes_waiting() > 0, 60, "the others to learn of it")
    assert handlers[0].verdict is None and handlers[1].verdict is None
    again = [joined(info) for info in join_all([handlers[0], handlers[1]])]
    assert sorted(node.rank for node in again) == [0, 1]
    assert {node.world_size for node in again} == {2}
    (line,) = [r.message for r in caplog.records if "goes on with" in r.message]
    assert re.match(r"node rank \d \(pod .+\) stopped: no heartbeat for ", line), line
    assert line.endswith("the elastic job goes on with the 2 node(s) left, in a new round")


@stalls_hide_the_beats
def test_a_silent_node_ends_an_elastic_job_that_would_fall_below_min(closing):
    """Elastic 2:3 running two nodes: without one of them fewer than MIN are left, so the
    silent node is the job's verdict, as in a static job."""
    handlers = elastic_handlers(
        2, 3, [0, 1], keep_alive_interval=BEAT, keep_alive_max_attempt=BEATS_MISSED
    )
    closing(handlers.values())
    assert {joined(info).world_size for info in join_all(list(handlers.values()))} == {2}
    handlers[1].close()
    with pytest.raises(JobStopped, match=r"node rank 1 \(pod .*\) stopped: no heartbeat for"):
        wait_for(lambda: handlers[0].num_nodes_waiting() < 0, 60, "the root's verdict")


def test_a_spare_node_waits_uncounted_while_the_job_runs_at_max(closing, caplog):
    """Elastic 1:2 running two nodes: a third agent is a spare. It waits without counting as
    waiting (it must not restart a full job), until the run ends: it reads the closed flag, or,
    if the root's host was quicker to leave, finds the root gone."""
    caplog.set_level(logging.INFO, logger="npu_job")
    members = list(elastic_handlers(1, 2, [0, 1]).values())
    spare = ParallelRendezvousHandler(members[1].settings)
    closing([*members, spare])
    assert {joined(info).world_size for info in join_all(members)} == {2}
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(spare.next_rendezvous)
        wait_for(lambda: "runs with the maximum of --nnodes=1:2" in caplog.text, 30, "the spare")
        assert members[0].num_nodes_waiting() == 0 and members[1].num_nodes_waiting() == 0
        assert not waiting.done()
        members[1].shutdown()
        members[0].shutdown()
        with pytest.raises((RendezvousClosedError, RendezvousConnectionError)):
            waiting.result(timeout=30)


def params(**overrides) -> RendezvousParameters:
    values = dict(
        backend="parallel",
        endpoint="10.0.0.1:29500",
        run_id="job",
        min_nodes=4,
        max_nodes=4,
        rank=2,
    )
    values.update(overrides)
    return RendezvousParameters(**values)


def test_settings_come_from_torchs_rendezvous_parameters():
    settings = backend.settings_from_params(
        params(
            timeout="60",
            join_timeout="5",
            enable_tiered_parallel_tcpstore=True,
            node_order="scheduler order",
        )
    )
    assert settings == ParallelSettings(
        run_id="job",
        master_addr="10.0.0.1",
        master_port=29500,
        node_rank=2,
        nnodes=4,
        tiered=True,
        store_timeout=60.0,
        join_timeout=5.0,
        node_order="scheduler order",
    )


def test_a_node_range_makes_the_settings_elastic():
    settings = backend.settings_from_params(params(min_nodes=2, last_call_timeout="3"))
    assert (settings.elastic, settings.fewest_nodes, settings.nnodes) == (True, 2, 4)
    assert settings.last_call == 3.0
    static = backend.settings_from_params(params())
    assert (static.elastic, static.fewest_nodes, static.min_nodes) == (False, 4, None)


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(
            dict(min_nodes=2, max_nodes=4, last_call_timeout="0"),
            "last_call_timeout: expected a positive",
            id="zero-last-call",
        ),
        pytest.param(dict(rank=4), "expected 0..3", id="rank-too-big"),
        pytest.param(dict(rank="x"), "expected an integer", id="rank-not-a-number"),
        pytest.param(dict(endpoint=""), "--master_addr/--master_port", id="no-endpoint"),
        pytest.param(dict(endpoint="10.0.0.1"), "port 1..65535", id="no-port"),
        pytest.param(
            dict(join_timeout="soon"),
            "join_timeout: expected a positive number of seconds",
            id="bad-join-timeout",
        ),
        pytest.param(dict(timeout="-1"), "timeout: expected a positive", id="negative-timeout"),
        # float() reads "nan", and NaN <= 0 is false: it passed as a timeout before
        pytest.param(dict(close_timeout="nan"), "close_timeout: expected a pos", id="nan-timeout"),
        pytest.param(
            dict(keep_alive_interval="0"),
            "keep_alive_interval: expected a positive",
            id="zero-keep-alive-interval",
        ),
        pytest.param(
            dict(keep_alive_interval="-1"),
            "keep_alive_interval: expected a positive",
            id="negative-keep-alive-interval",
        ),
        pytest.param(
            dict(keep_alive_max_attempt="2.5"),
            "keep_alive_max_attempt: expected a whole number >= 1",
            id="fractional-attempts",
        ),
        pytest.param(
            dict(keep_alive_max_attempt="0"),
            "keep_alive_max_attempt: expected a whole number >= 1",
            id="zero-attempts",
        ),
        pytest.param(
            dict(enable_tiered_parallel_tcpstore="maybe"), "expected true or false", id="bad-tiered"
        ),
    ],
)
def test_bad_settings_are_one_line_launch_errors(overrides, message):
    with pytest.raises(LaunchError, match=message) as caught:
        backend.settings_from_params(params(**overrides))
    assert "\n" not in str(caught.value)


def test_missing_rank_is_a_launch_error():
    values = dict(
        backend="parallel", endpoint="10.0.0.1:29500", run_id="job", min_nodes=1, max_nodes=1
    )
    with pytest.raises(LaunchError, match="pass --node_rank"):
        backend.settings_from_params(RendezvousParameters(**values))


def test_backend_is_registered_with_torch_elastic():
    backend.register()
    backend.register()  # idempotent
    handler = get_rendezvous_handler(params(endpoint="127.0.0.1:29500"))
    assert isinstance(handler, ParallelRendezvousHandler) and handler.get_backend() == "parallel"
    backend.close_all()


def _listening_ports(path: str) -> set:
    """Local ports in LISTEN state (st 0A) of /proc/net/tcp or /proc/net/tcp6."""
    with open(path) as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return {int(row[1].rsplit(":", 1)[1], 16) for row in rows if row[3] == "0A"}


@pytest.mark.parametrize("master_addr", ["127.0.0.1", "localhost"], ids=["ipv4-literal", "name"])
def test_root_listens_on_ipv4_so_accepts_need_no_dns(closing, master_addr):
    """The stock server reverse-resolves each accepted peer; on a dual-stack listener loopback
    peers appear as ::ffff:127.0.0.1, which only a DNS server answers. An IPv4 listener keeps
    those lookups in /etc/hosts."""
    if {info[0] for info in socket.getaddrinfo(master_addr, 1, type=socket.SOCK_STREAM)} != {
        socket.AF_INET
    }:
        pytest.skip(f"{master_addr} resolves to IPv6 here: the stock listener is kept")
    port = free_port()
    handler = ParallelRendezvousHandler(
        ParallelSettings(
            run_id="job",
            master_addr=master_addr,
            master_port=port,
            node_rank=0,
            nnodes=1,
            join_timeout=10.0,
            close_timeout=1.0,
            store_timeout=10.0,
            watch_interval=0.01,
        )
    )
    closing([handler])
    assert joined(handler.next_rendezvous()).rank == 0
    assert port in _listening_ports("/proc/net/tcp")
    assert port not in _listening_ports("/proc/net/tcp6")


class _RefusingTCPStore:
    """Stands in for torch's ``TCPStore`` where a real release refuses to host (torch 2.4-2.7's
    libuv server refuses a listen fd; the matrix runs those releases for real): the server
    constructor raises torch's error text, clients are real."""

    calls = 0
    ports: List[int] = []

    def __new__(cls, host, port, world_size=None, is_master=False, *args, **kwargs):
        if not is_master:
            return TCPStore(host, port, world_size, is_master, *args, **kwargs)
        cls.calls += 1
        cls.ports.append(port)
        if kwargs.get("use_libuv", True) and kwargs.get("master_listen_fd") is not None:
            raise RuntimeError(cls.message)
        return TCPStore(host, port, world_size, is_master, *args, **kwargs)


def test_a_root_that_torch_refuses_to_host_reports_torchs_error_once_and_frees_the_port(
    closing, monkeypatch
):
    refusing = type(
        "Refusing",
        (_RefusingTCPStore,),
        {"calls": 0, "ports": [], "message": "a bug of torch's own"},
    )
    monkeypatch.setattr(torchcompat, "TCPStore", refusing)
    monkeypatch.setattr(
        torchcompat, "_accepts", lambda parameter: False
    )  # no classic server to fall back on
    handlers = make_handlers(1, [0], close_timeout=5.0)
    closing(handlers.values())
    with pytest.raises(LaunchError, match="a bug of torch's own") as raised:
        handlers[0].next_rendezvous()
    assert "Address already in use" not in str(raised.value)
    assert refusing.calls == 1  # not retried: only a busy port is worth waiting for
    assert port_is_free(handlers[0].settings.master_port)  # our listening socket was closed


def test_a_libuv_server_that_takes_no_listen_fd_hosts_the_classic_server(closing, monkeypatch):
    refusing = type(
        "Refusing",
        (_RefusingTCPStore,),
        {
            "calls": 0,
            "ports": [],
            "message": "The libuv TCPStore backend does not support initialization with an listen fd",
        },
    )
    monkeypatch.setattr(torchcompat, "TCPStore", refusing)
    handlers = make_handlers(1, [0])
    closing(handlers.values())
    assert joined(handlers[0].next_rendezvous()).rank == 0
    root_port = handlers[0].settings.master_port
    assert refusing.ports[:2] == [root_port, root_port]  # refused once, then the classic server


def test_importing_the_backend_first_registers_it_without_a_warning():
    """torch's registry loads the ``torchrun.handlers`` entry point while the backend module is
    being imported; the entry point must not re-enter it (that logged a traceback)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "import npu_job.launcher.rendezvous.handler"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    assert (
        "Traceback" not in result.stderr and "Exception while registering" not in result.stderr
    ), result.stderr


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
@pytest.mark.parametrize("tiered", [False, True], ids=["flat", "tiered"])
def test_an_ipv6_master_hosts_the_root_and_serves_the_workers(closing, tiered):
    port = free_port()
    handlers = {
        rank: ParallelRendezvousHandler(
            ParallelSettings(
                run_id="job",
                master_addr="::1",
                master_port=port,
                node_rank=rank,
                nnodes=2,
                tiered=tiered,
                join_timeout=10.0,
                close_timeout=1.0,
                store_timeout=10.0,
                watch_interval=0.01,
            )
        )
        for rank in (0, 1)
    }
    closing(handlers.values())
    nodes = [joined(info) for info in join_all([handlers[0], handlers[1]])]
    assert [node.rank for node in nodes] == [0, 1]
    assert port in _listening_ports("/proc/net/tcp6")
    rank_0 = workers_store(nodes[0], hosting=True)
    other = workers_store(nodes[1], hosting=False)
    other.set("from-rank-2", "over IPv6")
    assert rank_0.get("from-rank-2") == b"over IPv6"


@stalls_hide_the_beats
def test_a_node_whose_agent_fails_tells_the_others_why_it_leaves(closing):
    """An agent that leaves on an error of its own (not a rendezvous error, not a verdict) names
    itself and the error, so nodes still training stop instead of waiting for it."""
    # the leaving node's word, not its missing heartbeat, stops node 0
    handlers = make_handlers(
        2, [0, 1], keep_alive_interval=BEAT, keep_alive_max_attempt=BEATS_MISSED
    )
    closing(handlers.values())
    join_all([handlers[0], handlers[1]])
    handlers[1].report_outcome("running")
    try:
        raise ValueError("the agent broke")
    except ValueError:
        handlers[1].shutdown()  # as torch's launch_agent does, in a finally
    with pytest.raises(
        JobStopped, match=r"node rank 1 \(pod .*\) left the job: ValueError: the agent broke"
    ):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            handlers[0].num_nodes_waiting()
            time.sleep(0.05)


@stalls_hide_the_beats
def test_a_proxy_that_cannot_take_its_port_again_stops_the_job_naming_it(closing):
    """The proxy's thread ends and its port cannot be bound again: the node's watch publishes
    the verdict, and every node stops naming that proxy."""
    made = []

    def factory(host, port, timeout, listen_port=0):
        if listen_port:
            raise OSError(98, "Address already in use")
        made.append(backend.start_store_proxy(host, port, timeout, listen_port))
        return made[-1]

    # the watch looks at the proxy every 0.2 s; the 5 s liveness window keeps a stalled heartbeat
    # on a loaded machine from stopping the job before the proxy's verdict does
    settings = make_handlers(
        2, [0, 1], keep_alive_interval=BEAT, keep_alive_max_attempt=BEATS_MISSED, tiered=True
    )
    handlers = {
        rank: ParallelRendezvousHandler(h.settings, proxy_factory=factory)
        for rank, h in settings.items()
    }
    closing(handlers.values())
    join_all([handlers[0], handlers[1]])
    made[-1].stop()  # node 1's proxy (joined last or first: either node's will do)
    with pytest.raises(
        JobStopped,
        match=r"its store proxy 127\.0\.0\.1:\d+ died and could not be "
        r"restarted on the same port: \[Errno 98\]",
    ):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for handler in handlers.values():
                handler.num_nodes_waiting()
            time.sleep(0.05)
