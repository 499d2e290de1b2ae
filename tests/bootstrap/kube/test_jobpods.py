"""A job's pods as the servers to order (no rank table): which pods, their indices, when the job
is complete and scheduled, and the servers they become, as the job's kind labels and names them.
The fixture is a `kubectl get pods -o json` of an 8-pod Volcano Job written here
(tests/bootstrap/fixtures/kube/pods.json); the same pods made by a kind of the tests' own
(tests/bootstrap/testkind.py) hold the code to the kind's record."""

import json
import random
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from npu_job.bootstrap import canonical, planner
from npu_job.bootstrap.base.model import Collective, RankTable
from npu_job.bootstrap.kube import jobpods
from npu_job.bootstrap.kube.facts import read_pods
from npu_job.bootstrap.kube.jobpods import JobSelector, job_roster, roster_table
from npu_job.bootstrap.kube.objects import read_objects
from npu_job.bootstrap.kube.topology import KubeContext, topology_from_objects
from npu_job.kinds.volcano import JOB_NAME_LABEL, TASK_INDEX_LABEL
from npu_job.kinds.volcano import KIND as VOLCANO

from npu_job.errors import InputError, NotReadyError

from ..testkind import INDEX_LABEL, NO_DNS, NUMBERED, Numbered, as_numbered

FIXTURES = Path(__file__).parent.parent / "fixtures" / "kube"
PODS = json.loads((FIXTURES / "pods.json").read_text())
CLUSTER = json.loads((FIXTURES / "cluster.json").read_text())
PLACEMENT = ["node-7", "node-2", "node-10", "node-4", "node-0", "node-8", "node-11", "node-3"]


def _pods(document=None):
    document = json.loads(json.dumps(PODS if document is None else document))
    return document, read_pods(read_objects(document, "pods").pods, "pods")


def _roster(document, selector=None):
    pods = read_pods(read_objects(document, "pods").pods, "pods")
    return job_roster(pods, selector or JobSelector(), "pods")


def test_the_jobs_pods_in_index_order_become_servers_named_by_node():
    document, _ = _pods()
    roster = _roster(document)
    assert roster.job == "llama" and roster.ready and roster.expected == 8
    table = roster_table(roster, "pods")
    ips = {
        n["metadata"]["name"]: n["status"]["addresses"][0]["address"]
        for n in (o.item for o in read_objects(CLUSTER, "c").nodes)
    }
    assert [s.server_id for s in table.servers] == [
        ips[name] for name in PLACEMENT
    ]  # status.hostIP
    assert [s.host_ip for s in table.servers] == [s.server_id for s in table.servers]
    assert jobpods.node_names(roster) == tuple(PLACEMENT)
    assert [s.pod_name for s in table.servers] == [f"llama-worker-{i}" for i in range(8)]
    assert [s.pod_index for s in table.servers] == list(range(8))
    assert table.device_counts == (8,) * 8  # nvidia.com/gpu limits
    assert RankTable(table.version, table.status, table.servers).device_counts == (8,) * 8


def test_a_topology_of_node_names_is_keyed_by_the_servers():
    from npu_job.bootstrap.base.model import Placement, Topology

    document, _ = _pods()
    roster = _roster(document)
    table = roster_table(roster, "pods")
    topology = Topology(
        {"node-7": Placement((), ("t1",)), "10.1.7.130": Placement((), ("t2",))}, "x"
    )
    keyed = jobpods.by_server(topology, table, jobpods.node_names(roster))
    assert dict(keyed.placements) == {
        "10.1.9.18": Placement((), ("t1",)),
        "10.1.7.130": Placement((), ("t2",)),
    }
    assert keyed.source == "x" and jobpods.by_server(None, table, ()) is None


def test_a_topology_of_every_node_is_keyed_by_node_name_alone():
    """Placed by node name, never by address, when both would place a server."""
    from npu_job.bootstrap.base.model import Placement, Topology

    document, _ = _pods()
    roster = _roster(document)
    table = roster_table(roster, "pods")
    nodes = jobpods.node_names(roster)
    by_node = {node: Placement((), (f"t-{node}",)) for node in nodes}
    by_address = {server.server_id: Placement((), ("wrong",)) for server in table.servers}
    keyed = jobpods.by_server(Topology({**by_address, **by_node}, "x"), table, nodes)
    assert dict(keyed.placements) == {
        server.server_id: by_node[node] for server, node in zip(table.servers, nodes)
    }


def test_index_from_the_task_index_label_else_the_name_suffix():
    document, _ = _pods()
    for item in document["items"]:
        item["metadata"]["labels"].pop("volcano.sh/task-index", None)
    assert [p.name for p in _roster(document).pods] == [f"llama-worker-{i}" for i in range(8)]
    item = document["items"][2]
    item["metadata"]["name"] = "llama-worker-x2"
    with pytest.raises(InputError) as caught:
        _roster(document)
    assert caught.value.message.startswith(
        "pods: items[2] (Pod 'llama-worker-x2'): metadata.name: expected a volcano.sh/task-index label or "
        "a pod name ending in -<index>"
    )


def test_unscheduled_and_missing_pods_keep_the_job_waiting_and_say_which():
    document, _ = _pods()
    del document["items"][3]["spec"]["nodeName"]
    del document["items"][5]  # not created yet
    roster = _roster(document, JobSelector(expected=8))
    assert not roster.ready
    assert roster.missing == (5,) and roster.unscheduled == ("llama-worker-3",)
    assert roster.progress() == (
        "6 of 8 pods of job 'llama' scheduled; waiting: pod index(es) 5 not "
        "created; 'llama-worker-3' not scheduled"
    )
    error = jobpods.not_ready_error(roster, "api", waited=300)
    assert isinstance(error, NotReadyError) and error.message.startswith(
        "api: pods: expected every pod of job 'llama' scheduled within 300 s; 6 of 8"
    )
    with pytest.raises(ValueError):
        roster_table(roster, "pods")


def test_without_an_expected_count_a_gap_in_the_indices_is_waited_for():
    document, _ = _pods()
    del document["items"][2]
    roster = _roster(document)
    assert roster.expected == 8 and roster.missing == (2,) and not roster.ready
    with pytest.raises(
        InputError,
        match=r"items\[6\] \(Pod 'llama-worker-7'\): metadata.labels."
        r"volcano.sh/task-index: expected a pod index below 6, the "
        r"job's pod count \(MA_NUM_HOSTS\); got 7$",
    ):
        _roster(document, JobSelector(expected=6))


def test_ended_and_deleted_pods_do_not_count_and_a_replacement_does():
    document, _ = _pods()
    old = json.loads(json.dumps(document["items"][1]))
    old["metadata"]["deletionTimestamp"] = "2026-03-02T09:30:00Z"
    old["metadata"]["name"] = "llama-worker-1"
    document["items"].append(old)
    failed = json.loads(json.dumps(document["items"][4]))
    failed["status"]["phase"] = "Failed"
    failed["spec"]["nodeName"] = "node-5"
    document["items"].insert(0, failed)
    roster = _roster(document)
    assert roster.ready and [p.node_name for p in roster.pods] == PLACEMENT


def test_two_live_pods_with_one_index_and_two_pods_on_one_node_are_errors():
    document, _ = _pods()
    twin = json.loads(json.dumps(document["items"][1]))
    twin["metadata"]["name"] = "llama-worker-1b"
    document["items"].append(twin)
    with pytest.raises(
        InputError,
        match=r"metadata.labels.volcano.sh/task-index: expected one live pod "
        r"per index; 1 is also pod 'llama-worker-1'",
    ):
        _roster(document)
    document, _ = _pods()
    document["items"][5]["spec"]["nodeName"] = "node-7"
    with pytest.raises(InputError) as caught:
        roster_table(_roster(document), "pods")
    assert caught.value.message == (
        "pods: items[5] (Pod 'llama-worker-5'): spec.nodeName: expected one pod of the job per node "
        "(routing orders nodes); pods 'llama-worker-0' and 'llama-worker-5' are both on node 'node-7' "
        "(in the job spec, anti_affinity: true)"
    )


def test_other_jobs_tasks_and_namespaces_are_left_out():
    document, _ = _pods()
    stranger = json.loads(json.dumps(document["items"][0]))
    stranger["metadata"]["labels"]["volcano.sh/job-name"] = "other"
    stranger["metadata"]["name"] = "other-worker-0"
    document["items"].append(stranger)
    with pytest.raises(InputError) as caught:
        _roster(document)
    assert caught.value.message == (
        "pods: items: expected the pods of one Volcano Job, got pods of 2 jobs ('llama', 'other')"
    )
    assert caught.value.tip == "--job names the one to plan"
    assert _roster(document, JobSelector(job="llama")).ready
    assert [p.name for p in _roster(document, JobSelector(job="other")).pods] == ["other-worker-0"]
    assert _roster(document, JobSelector(job="llama", task="master")).pods == ()
    assert _roster(document, JobSelector(job="llama", namespace="team-b")).pods == ()


def test_a_cpu_pod_counts_one_device_and_a_gpu_count_is_read_from_its_limits():
    document, _ = _pods()
    for item in document["items"][:8]:
        item["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "4"}}
    document["items"][0]["spec"]["containers"][0]["resources"] = {
        "limits": {"huawei.com/ascend-1980": 16}
    }
    table = roster_table(_roster(document), "pods")
    assert table.device_counts == (16,) + (1,) * 7
    # the counts it was built with are the counts of its servers' devices
    assert tuple(len(server.devices) for server in table.servers) == table.device_counts
    assert planner.plan(table, None, full_node_devices=None).reasons[0].startswith("partial nodes")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_listing_order_gives_the_same_servers_and_plan(seed):
    """The API lists pods (and nodes, and HyperNodes) in whatever order it likes."""

    def plan_of(document):
        objects = read_objects(document, "c")
        roster = job_roster(read_pods(objects.pods, "c"), JobSelector(), "c")
        table = roster_table(roster, "c")
        nodes = jobpods.node_names(roster)
        topology = topology_from_objects(objects, "c", context=KubeContext(names=nodes)).topology
        topology = jobpods.by_server(topology, table, nodes)
        return canonical.input_digest(table, topology, Collective.RING), planner.plan(
            table, topology
        )

    expected = plan_of(CLUSTER)
    shuffled = json.loads(json.dumps(CLUSTER))
    random.Random(seed).shuffle(shuffled["items"])
    digest, plan = plan_of(shuffled)
    assert digest == expected[0] and plan == expected[1] and plan.status.value == "success"


def _roster_pod_by_pod(pods, selector, source):
    """What job_roster answers, spelled out pod by pod with pod_index (the reference); its
    refusals say what job_roster's say (a bad label's is pod_index's own)."""
    job, kind = selector.job, selector.kind
    chosen = {}
    for pod in pods:
        if (
            not kind.selects(pod.labels, job, selector.task or "")
            or pod.deleting
            or pod.phase in jobpods.ENDED_PHASES
        ):
            continue
        index = jobpods.pod_index(pod, source, kind)
        if index in chosen:
            raise InputError(source, "labels", "one live pod per index")
        chosen[index] = pod
    expected = selector.expected if selector.expected is not None else max(chosen, default=-1) + 1
    if any(index >= expected for index in chosen):
        raise InputError(source, "labels", f"a pod index below {expected}")
    indices = tuple(sorted(chosen))
    ordered = tuple(chosen[index] for index in indices)
    return jobpods.Roster(
        job,
        ordered,
        indices,
        expected,
        tuple(pod.name for pod in ordered if not (pod.node_name and pod.host_ip)),
        tuple(index for index in range(expected) if index not in chosen)[: jobpods.LISTED],
    )


_INDEX_LABELS = st.one_of(
    st.integers(0, 12).map(str),  # the usual label
    st.integers(0, 12).map(lambda index: f"00{index}"),  # leading zeros
    st.sampled_from([None, "", "x1", "1.0", "-1", "\u0661", "0" * 20 + "3", "9" * 19, " 2"]),
)


@settings(max_examples=150, deadline=None)
@given(
    pods=st.lists(
        st.tuples(
            _INDEX_LABELS,
            st.integers(0, 12),  # the index the name ends in
            st.sampled_from(["llama", "other"]),
            st.sampled_from(["worker", "ps"]),
            st.sampled_from(["Running", "Pending", "Succeeded", "Failed"]),
            st.booleans(),  # deleting
            st.booleans(),  # scheduled
        ),
        max_size=14,
    ),
    expected=st.none() | st.integers(1, 14),
    task=st.none() | st.just("worker"),
    kind=st.sampled_from([VOLCANO, NUMBERED]),
)
@example(  # 19 digits: more than a count has, though int() reads them
    pods=[("9" * 19, 0, "llama", "worker", "Running", False, True)],
    expected=3,
    task=None,
    kind=VOLCANO,
)
@example(  # three pods of a 3-pod job, one of them numbered 3
    pods=[(label, 0, "llama", "worker", "Running", False, True) for label in ("0", "1", "3")],
    expected=3,
    task=None,
    kind=VOLCANO,
)
@example(  # two pods with one index, each label well-formed
    pods=[("1", 0, "llama", "worker", "Running", False, True)] * 2,
    expected=3,
    task=None,
    kind=VOLCANO,
)
def test_the_roster_is_the_pods_read_one_by_one(pods, expected, task, kind):
    """Whatever the labels say (no label, leading zeros, non-digits, an index twice, beyond the
    count), the roster is what reading pod by pod with pod_index gives, or the same refusal, for
    the Volcano Job and for a kind with its own labels (and no group label: a task says nothing
    there)."""
    from npu_job.bootstrap.kube.facts import PodFacts

    facts = [
        PodFacts(
            name=f"{job}-{spec}-{name_index}",
            labels={
                kind.job_label: job,
                **({kind.group_label: spec} if kind.group_label else {}),
                **({} if label is None else {kind.index_label: label}),
                **dict(kind.constant_labels),
            },
            node_name=f"node-{position}" if scheduled else "",
            host_ip=f"10.0.0.{position}" if scheduled else "",
            phase=phase,
            deleting=deleting,
            where=f"items[{position}]",
        )
        for position, (label, name_index, job, spec, phase, deleting, scheduled) in enumerate(pods)
    ]
    selector = JobSelector(job="llama", task=task, expected=expected, kind=kind)
    try:
        want = _roster_pod_by_pod(facts, selector, "pods")
    except InputError as refused:
        with pytest.raises(InputError) as error:
            job_roster(facts, selector, "pods")
        assert refused.expected in error.value.expected
        assert error.value.field.endswith((f"labels.{kind.index_label}", "metadata.name"))
    else:
        roster = job_roster(facts, selector, "pods")
        assert roster == want
        present = set(roster.indices)
        assert roster.missing_count == len([i for i in range(roster.expected) if i not in present])


def test_a_pod_claiming_a_huge_index_without_a_count_waits_and_says_so_at_once():
    """Without MA_NUM_HOSTS the highest index says how many pods there are: a label of 10**17 is
    a job waiting for pods that never come (and timing out into scheduler order), not a list of
    10**17 missing indices built for its progress line."""
    from npu_job.bootstrap.kube.facts import PodFacts

    pods = [
        PodFacts(
            f"llama-worker-{i}",
            labels={JOB_NAME_LABEL: "llama", TASK_INDEX_LABEL: label},
            node_name=f"node-{i}",
            host_ip=f"10.0.0.{i}",
        )
        for i, label in enumerate(["0", "2", "1" + "0" * 17])
    ]
    roster = job_roster(pods, JobSelector(job="llama"), "pods")
    assert not roster.ready and roster.missing_count == 10**17 - 2
    assert roster.missing == (1, 3, 4, 5, 6)
    assert "pod index(es) 1, 3, 4, 5, 6 and 99999999999999993 more not created" in roster.progress()


# --- another kind ---------------------------------------------------------------------------


def _numbered(document=None):
    """The fixture's pods as the tests' own kind makes them, with a Volcano job beside them."""
    document = json.loads(json.dumps(PODS if document is None else document))
    volcano = json.loads(json.dumps(document["items"][0]))
    volcano["metadata"]["name"] = "vc-worker-0"
    volcano["metadata"]["labels"]["volcano.sh/job-name"] = "vc"
    document["items"] = [as_numbered(item) for item in document["items"]] + [volcano]
    return document


def _numbered_roster(document, **selector):
    return _roster(document, JobSelector(kind=NUMBERED, **selector))


def test_another_kinds_pods_are_those_its_labels_select_in_the_order_they_give():
    """The same pods made by another controller: the same servers, in the same order, found by
    that kind's labels (its job label and its controller's), never by Volcano's."""
    volcano = roster_table(_roster(_pods()[0]), "pods")
    document = _numbered()
    roster = _numbered_roster(document)
    assert roster.job == "llama" and roster.ready
    assert roster_table(roster, "pods") == volcano
    assert _numbered_roster(document, task="master") == roster  # the kind has no group label
    for item in document["items"]:
        item["metadata"]["labels"].pop(INDEX_LABEL, None)  # the index from the name alone
    assert roster_table(_numbered_roster(document), "pods") == volcano
    stranger = document["items"][0]
    del stranger["metadata"]["labels"]["example.com/controller"]  # another controller's set
    assert [p.name for p in _numbered_roster(document).pods] == [
        f"llama-worker-{i}" for i in range(1, 8)
    ]


@pytest.mark.parametrize(
    "damage, message",
    [
        pytest.param(
            {"name": "llama-worker-x2", "label": None},
            "metadata.name: expected a example.com/set-index label or a pod name <set>-<index>, "
            "got a string 'llama-worker-x2'",
            id="no-index",
        ),
        pytest.param(
            {"label": "two"},
            "metadata.labels.example.com/set-index: expected a pod index (digits), got a string 'two'",
            id="bad-label",
        ),
        pytest.param(
            {"label": "1"},
            "metadata.labels.example.com/set-index: expected one live pod per index; 1 is also "
            "pod 'llama-worker-1'",
            id="one-index-twice-by-label",
        ),
        pytest.param(
            {"name": "llama-worker-1", "label": None, "strip": True},
            "metadata.name: expected one live pod per index; 1 is also pod 'llama-worker-1'",
            id="one-index-twice-by-name",
        ),
    ],
)
def test_a_pod_whose_kind_finds_no_index_or_a_taken_one_is_one_line_naming_pod_and_field(
    damage, message
):
    document = _numbered()
    item = document["items"][2]
    if damage.get("strip"):  # every index from the names
        for each in document["items"]:
            each["metadata"]["labels"].pop(INDEX_LABEL, None)
    if "name" in damage:
        item["metadata"]["name"] = damage["name"]
    if damage.get("label") is None:
        item["metadata"]["labels"].pop(INDEX_LABEL, None)
    else:
        item["metadata"]["labels"][INDEX_LABEL] = damage["label"]
    with pytest.raises(InputError) as caught:
        _numbered_roster(document)
    assert "\n" not in caught.value.message
    assert caught.value.message == f"pods: items[2] (Pod {item['metadata']['name']!r}): {message}"


def test_pods_of_no_job_of_the_kind_name_the_kind_and_its_label():
    with pytest.raises(InputError) as caught:
        _roster(_pods()[0], JobSelector(kind=NUMBERED))
    assert caught.value.message == (
        "pods: items: expected pods of a Numbered Set (label example.com/set-name)"
    )
    with pytest.raises(InputError, match="expected the pods of one Numbered Set, got pods of 2"):
        document = _numbered()
        document["items"][0]["metadata"]["labels"]["example.com/set-name"] = "other"
        _numbered_roster(document)


def test_a_kind_that_reads_its_indices_its_own_way_is_read_its_way():
    """A kind whose pod_index is its own (here: the name alone, whatever the label says) is not
    read by the label's fast path."""

    class ByName(Numbered):
        def pod_index(self, labels, name):
            return self.index_from_name(name)

    document = _numbered()
    for position, item in enumerate(document["items"][:8]):
        item["metadata"]["labels"][INDEX_LABEL] = str(7 - position)  # every label says otherwise
    roster = _roster(document, JobSelector(kind=ByName()))
    assert [p.name for p in roster.pods] == [f"llama-worker-{i}" for i in range(8)]
    assert [p.name for p in _numbered_roster(document).pods] == [
        f"llama-worker-{i}" for i in reversed(range(8))
    ]
    document["items"][2]["metadata"]["name"] = "llama-worker-x"  # its label is a fine index
    with pytest.raises(InputError) as caught:
        _roster(document, JobSelector(kind=ByName()))
    assert caught.value.message.startswith(
        "pods: items[2] (Pod 'llama-worker-x'): metadata.name: expected a example.com/set-index "
    )


def test_pods_of_an_earlier_attempt_of_a_restarted_jobset_do_not_count():
    from npu_job.bootstrap.kube.facts import PodFacts
    from npu_job.kinds import KINDS

    jobset = KINDS["jobset"]

    def pod(index, attempt):
        labels = {
            "jobset.sigs.k8s.io/jobset-name": "llama",
            "jobset.sigs.k8s.io/replicatedjob-name": "worker",
            "jobset.sigs.k8s.io/restart-attempt": str(attempt),
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        name = f"llama-worker-0-{index}-{'bcdfg' if attempt else 'hjklm'}"
        host = f"10.0.{attempt}.{index}"
        return PodFacts(name, "team", labels, f"node-{host}", host, "Running")

    # the restart made every pod again, with the next attempt; two of the old linger, not deleted
    pods = [pod(0, 0), *(pod(index, 1) for index in range(3)), pod(2, 0)]
    selector = JobSelector(job="llama", task="worker", expected=3, kind=jobset)
    roster = job_roster(pods, selector, "pods")
    assert roster.ready and [p.host_ip for p in roster.pods] == ["10.0.1.0", "10.0.1.1", "10.0.1.2"]
    assert {(p.phase, p.pod_ip) for p in roster.pods} == {("Running", "")}  # as given by position


def test_a_kind_reached_by_pod_ip_waits_for_every_pods_ip():
    """A kind without DNS names: the master is its pod IP, which every pod must read alike."""
    document = _numbered()
    del document["items"][3]["status"]["podIP"]  # its network is not set up yet
    assert _numbered_roster(document).ready  # a kind with DNS names does not wait for it
    waiting = _roster(document, JobSelector(kind=NO_DNS))
    assert not waiting.ready and waiting.unscheduled == ("llama-worker-3",)
    document = _numbered()
    roster = _roster(document, JobSelector(kind=NO_DNS))
    assert roster.ready
    assert jobpods.pod_addresses(roster) == tuple(
        item["status"]["podIP"] for item in sorted(document["items"][:8], key=_index)
    )


def _index(item):
    return int(item["metadata"]["labels"][INDEX_LABEL])
