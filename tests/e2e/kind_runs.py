"""The demo routed by the API (``npu-job demo --kind K``): the run, and what a kind's end-to-end
case checks.

The pods' bootstraps list the job's pods, Nodes and HyperNodes from a Kubernetes API served on
loopback: a real HTTPS server, the thin fake of the documented LIST endpoints in tests/bootstrap
(no API server runs here), serving the pods as the kind's controller makes them
(``JobKind.controller_pods``, through the demo's ``job_pods``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List

from npu_job.demo import podsim
from npu_job.kinds import KINDS

from npu_job import demo

#: why the pods cannot run here (no unshare), else None
UNSHARE = podsim.unshare_unavailable_reason()


@dataclass
class KindRun:
    result: demo.DemoResult
    pod_lists: List[Dict[str, List[str]]]  # the query of every pods LIST the pods made

    @property
    def selectors(self) -> FrozenSet[str]:
        """The labelSelector of every pods LIST."""
        return frozenset(
            selector for query in self.pod_lists for selector in query.get("labelSelector", [""])
        )

    def pod_log(self, index: int) -> str:
        return (self.result.prepared.spec_files[index].parent / "pod.log").read_text(
            errors="replace"
        )

    def explain(self) -> str:
        logs = [
            f"== pod {index}\n{self.pod_log(index)[-2000:]}"
            for index in range(len(self.result.prepared.spec_files))
        ]
        return "\n".join(self.result.problems + logs)


def routed_options(kind: str) -> demo.DemoOptions:
    """Six pods over three ToRs routed by the API, the seed's plan moving rank 0 off pod 0."""
    return demo.DemoOptions(
        kind=kind,
        nodes=6,
        tors=3,
        nproc_per_node=1,
        steps=4,
        seed=0,
        routing_source="api",
        timeout=200,
    )


def run_routed_by_the_api(
    options: demo.DemoOptions,
    tmp_path: Path,
    served: Callable[[Dict[str, List[Dict[str, Any]]]], None] = lambda objects: None,
) -> KindRun:
    """Run the demo of ``options`` (``routing_source="api"``) against the fake API, which serves
    the cluster's objects as ``served`` leaves them (a case's own changes: pods a controller left
    behind)."""
    from tests.bootstrap.fake_kube_api import FakeKubernetesAPI
    from tests.bootstrap.https_server import HTTPSServer, make_self_signed

    cert, key = make_self_signed(tmp_path)
    ips = demo.loopback_ips(options.nodes)
    objects = demo.cluster_objects(
        demo.simulated_cluster(options, ips), ips, pods=demo.job_pods(options)
    )
    served(objects)
    with HTTPSServer(cert, key, keep_alive=True) as server:
        fake = FakeKubernetesAPI(
            server,
            "pod-token",
            objects["nodes"],
            pods=objects["pods"],
            hypernodes=objects["hypernodes"],
            namespaces=("default",),
        )
        api = demo.ClusterAPI("127.0.0.1", server.port, "pod-token", cert.read_text())
        result = demo.run(options, tmp_path / "w", api=api)
    return KindRun(result, [query for path, query in fake.lists if path.endswith("/pods")])


MASTER_LINE = re.compile(r"npu-job: node rank \d+ of \d+, master (\S+):\d+")


def assert_planned_and_trained(run: KindRun, group: str = "") -> None:
    """What every kind's case shows: every pod (routed by the API) listed its job by the kind's
    selector, and every pod planned the same order, the ring is at the lower bound, and npu-run's ranks follow the plan with rank
    0 on the planned pod, and the root store on pod index 0, reached by the kind's DNS name of it."""
    result = run.result
    kind = KINDS[result.options.kind]
    assert result.ok, run.explain()
    plan = result.prepared.plan
    assert str(plan.status) == "success" and plan.master_index != 0, "pick a seed that moves it"
    assert result.score.cross_after == result.score.lower_bound < result.score.cross_before
    if result.options.routing_source == "api":
        assert run.selectors == {kind.selector(demo.JOB_NAME, group)}
    for pod in result.pods:
        assert pod.route_plan["rank_mapping"] == plan.rank_mapping
        assert pod.rank_after_acc == str(plan.node_rank_of_pod[pod.index])
        assert pod.master_index == str(plan.master_index)
    rank0 = next(report for report in result.reports if report["rank"] == 0)
    assert rank0["pod_index"] == plan.master_index
    # the root store stays on pod index 0, at the kind's stable name of it (an AscendJob's, the
    # operator's Service of its Master), which a replaced pod keeps: only the ranks move
    masters = {
        found.group(1)
        for index in range(result.options.nodes)
        for found in [MASTER_LINE.search(run.pod_log(index))]
        if found
    }
    root = kind.dns_name(demo.JOB_NAME, group, 0)
    assert len(masters) == 1 and (not root or masters == {root}), masters
    assert "hosting the root store" in run.pod_log(0)


def trained_on_hosts(kind: str, tmp_path: Path, prefix: str) -> demo.DemoResult:
    """The kind's demo (six pods over three ToRs, the seed's plan moving rank 0 off pod 0) with
    every pod on its own simulated host (``test_pipeline.run_on_hosts``): it trained."""
    from tests.e2e.test_pipeline import explain, run_on_hosts

    options = demo.DemoOptions(
        kind=kind, nodes=6, nproc_per_node=1, tors=3, seed=0, steps=8, timeout=150
    )
    result = run_on_hosts(options, tmp_path, prefix)
    assert result.ok, explain(result)
    return result
