"""A Volcano job of any size as the cluster's objects: Nodes, HyperNodes and the job's Pods.

Built from the hand-written fixtures (tests/bootstrap/fixtures/kube): every pod is a copy of the
fixture job's first pod (its containers, env, volumes and status: about 5 KB, as a real pod
lists), renamed and placed; nodes likewise from the fixture's first node. The job's pods land on
the nodes in a seeded shuffle (the scheduler's order says nothing about the network), the nodes
sit under ``leaves`` leaf HyperNodes of ``per_spine`` under each spine, all under one root, each
member by ``exactMatch`` as Volcano's label discovery writes them.

By default the pods are a Volcano job's; given the pods a kind's controller makes of a rendered
job (:meth:`npu_job.kinds.base.JobKind.controller_pods`), they take those pods' names, hostnames,
subdomain, labels, annotations and container name instead, so that jobs of two kinds differ only
in what their kinds change.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from npu_job.kinds.base import ControllerPod

FIXTURES = Path(__file__).parent / "fixtures" / "kube"
_POD = json.loads((FIXTURES / "pods.json").read_text())["items"][0]
_NODE = json.loads((FIXTURES / "nodes.json").read_text())["items"][0]


def node_ip(index: int) -> str:
    return f"10.{16 + index // 65536}.{index // 256 % 256}.{index % 256}"


def big_job(
    pods: int,
    *,
    leaves: int,
    per_spine: int = 16,
    seed: int = 0,
    job: str = "llama",
    namespace: str = "team-a",
    controller: Optional[Sequence[ControllerPod]] = None,
) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], List[Dict[str, Any]]]:
    """``(nodes, hypernodes, pods)`` of a ``pods``-pod job on as many nodes (its pods those the
    ``controller`` made, in index order, when given)."""
    if controller is not None and len(controller) != pods:
        raise ValueError(f"{len(controller)} controller pods for a {pods}-pod job")
    rng = random.Random(seed)
    nodes = []
    for index in range(pods):
        node = copy.deepcopy(_NODE)
        name = f"gpu-node-{index}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"] = {**node["metadata"]["labels"], "kubernetes.io/hostname": name}
        node["metadata"]["labels"].pop("example.com/rack", None)
        node["status"]["addresses"] = [
            {"address": node_ip(index), "type": "InternalIP"},
            {"address": name, "type": "Hostname"},
        ]
        nodes.append(node)
    names = [node["metadata"]["name"] for node in nodes]
    leaf_of = sorted(range(pods), key=lambda i: rng.random())  # nodes scattered over the leaves
    hypernodes: List[Dict[str, Any]] = []
    spines = (leaves + per_spine - 1) // per_spine
    for leaf in range(leaves):
        members = [names[i] for position, i in enumerate(leaf_of) if position % leaves == leaf]
        hypernodes.append(_hypernode(f"leaf-{leaf}", 1, "Node", members))
    for spine in range(spines):
        hypernodes.append(
            _hypernode(
                f"spine-{spine}",
                2,
                "HyperNode",
                [f"leaf-{leaf}" for leaf in range(leaves) if leaf // per_spine == spine],
            )
        )
    hypernodes.append(_hypernode("root", 3, "HyperNode", [f"spine-{s}" for s in range(spines)]))
    placement = list(range(pods))
    rng.shuffle(placement)
    job_pods = []
    for index, node_index in enumerate(placement):
        pod = copy.deepcopy(_POD)
        meta = pod["metadata"]
        meta["name"] = f"{job}-worker-{index}"
        meta["namespace"] = namespace
        meta["labels"] = {
            **meta["labels"],
            "volcano.sh/job-name": job,
            "volcano.sh/task-index": str(index),
        }
        meta["annotations"] = {
            **meta["annotations"],
            "volcano.sh/job-name": job,
            "volcano.sh/task-index": str(index),
        }
        meta["uid"] = f"{meta['uid'][:-12]}{index:012d}"
        pod["spec"]["nodeName"] = names[node_index]
        pod["spec"]["hostname"] = meta["name"]
        pod["status"]["hostIP"] = node_ip(node_index)
        pod["status"]["hostIPs"] = [{"ip": node_ip(node_index)}]
        if controller is not None:
            _as_made(pod, controller[index])
        job_pods.append(pod)
    return nodes, hypernodes, job_pods


def _as_made(pod: Dict[str, Any], made: ControllerPod) -> None:
    """``pod`` named, labelled and annotated as its kind's controller made it, with an address of
    its own (a kind may name the pod of the new rank 0 by its pod IP)."""
    meta = pod["metadata"]
    meta["name"] = made.name
    meta["labels"] = dict(made.labels)
    meta["annotations"] = dict(made.annotations)
    pod["spec"]["hostname"] = made.hostname
    if made.subdomain:
        pod["spec"]["subdomain"] = made.subdomain
    else:
        pod["spec"].pop("subdomain", None)
    ip = f"172.{20 + made.index // 65536}.{made.index // 256 % 256}.{made.index % 256}"
    pod["status"]["podIP"] = ip
    pod["status"]["podIPs"] = [{"ip": ip}]
    containers = (made.template.get("spec") or {}).get("containers") or []
    for container, template in zip(pod["spec"]["containers"], containers):
        container["name"] = template.get("name", container["name"])


def _hypernode(name: str, tier: int, kind: str, members: List[str]) -> Dict[str, Any]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "resourceVersion": "1", "generation": 1},
        "spec": {
            "tier": tier,
            "members": [{"type": kind, "selector": {"exactMatch": {"name": m}}} for m in members],
        },
        "status": {"nodeCount": len(members)},
    }
