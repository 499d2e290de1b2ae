"""Small input documents in the shapes the platform produces (the formats of docs/bootstrap.md).

Each builder returns a fresh dict, so a test may mutate it into a bad input. Values are invented;
the shapes follow the CCE / MindCluster / HCCL formats (every number a string in rank tables).
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml
from npu_job.bootstrap.base.model import RankTable, Topology
from npu_job.bootstrap.kube.objects import decode_objects
from npu_job.bootstrap.kube.topology import KubeContext
from npu_job.bootstrap.ranktable import rank_table_document
from npu_job.bootstrap.topology import encode_ranktable_tor, parse_topology
from npu_job.demo.synthetic import synthetic_cluster


def devices(
    node: int, count: int = 2, *, first_rank: Optional[int] = None, **extra: str
) -> List[Dict[str, str]]:
    start = node * count if first_rank is None else first_rank
    return [
        {"device_id": str(d), "device_ip": f"29.{node}.{d}.1", "rank_id": str(start + d), **extra}
        for d in range(count)
    ]


def v1_0(ids: Tuple[str, ...] = ("192.168.0.11", "192.168.0.12", "192.168.0.13")) -> Dict[str, Any]:
    """CCE ``jobstart_hccl.json`` v1.0: server_list in pod-index order."""
    return {
        "status": "completed",
        "version": "1.0",
        "server_count": str(len(ids)),
        "server_list": [{"server_id": sid, "device": devices(i)} for i, sid in enumerate(ids)],
    }


def v1_2_super_pods() -> Dict[str, Any]:
    """Atlas A3 v1.2: host_ip/container_ip/hardware_type per server, super_device_id, super pods."""
    servers = []
    for i in range(4):
        servers.append(
            {
                "device": devices(i, super_device_id=str(37748736 + i)),
                "server_id": f"node-{i}",
                "host_ip": f"10.0.0.{i + 1}",
                "container_ip": f"192.168.149.{i + 1}",
                "hardware_type": "800I-A3-64G",
            }
        )
    return {
        "status": "completed",
        "server_list": servers,
        "server_count": "4",
        "version": "1.2",
        "super_pod_list": [
            {
                "super_pod_id": "1",
                "server_list": [{"server_id": "node-1"}, {"server_id": "node-3"}],
            },
            {
                "super_pod_id": "0",
                "server_list": [{"server_id": "node-0"}, {"server_id": "node-2"}],
            },
        ],
    }


def v1_4_cce() -> Dict[str, Any]:
    """volcano-global v1.4: data_version (a number), dpu_ip, numa_id, super pods, cluster_list."""
    servers = [
        {
            "server_id": f"111.111.111.{i + 1}",
            "device": devices(i, super_device_id=str(i), dpu_ip="0.0.0.0", numa_id="0"),
        }
        for i in range(3)
    ]
    return {
        "status": "completed",
        "version": "1.4",
        "data_version": 3,
        "server_count": "3",
        "server_list": servers,
        "super_pod_list": [
            {
                "super_pod_id": f"hypernode-{i}",
                "server_list": [{"server_id": f"111.111.111.{i + 1}"}],
            }
            for i in range(3)
        ],
        "cluster_list": [
            {
                "cluster_id": "0",
                "az_id": "az1",
                "region_id": "cn-north-7",
                "super_pod_list": [{"super_pod_id": f"hypernode-{i}"} for i in range(3)],
            }
        ],
    }


def legacy_group_list() -> Dict[str, Any]:
    """Legacy "v0": one group, instances in arrival order (pod-2, pod-0, pod-1), no rank ids."""

    def instance(index: int) -> Dict[str, Any]:
        return {
            "pod_name": f"fake-job-pod-{index}",
            "server_id": f"10.19.1.{70 + index}",
            "devices": [{"device_id": str(d), "device_ip": f"192.{index}.{d}.7"} for d in range(2)],
        }

    return {
        "status": "completed",
        "group_count": "1",
        "group_list": [
            {
                "group_name": "fake-job",
                "device_count": "6",
                "instance_count": "3",
                "instance_list": [instance(2), instance(0), instance(1)],
            }
        ],
    }


def ranktable_tor(servers: Dict[str, List[str]]) -> Dict[str, Any]:
    """CCE ``ranktable_tor.json``: per-device tor_ip (one entry per device), rank_id empty."""
    server_list = []
    for index, (server_id, tors) in enumerate(servers.items()):
        server_list.append(
            {
                "pod_name": f"demo-job-worker-{index}",
                "server_id": server_id,
                "device": [
                    {
                        "device_id": str(d),
                        "device_ip": f"29.{index}.{d}.1",
                        "rank_id": "",
                        "tor_ip": tor,
                        "tor_port": f"200GE1/0/{d + 1}",
                    }
                    for d, tor in enumerate(tors)
                ],
            }
        )
    return {
        "status": "completed",
        "version": "1.0",
        "server_count": str(len(server_list)),
        "server_list": server_list,
    }


def tor_info() -> Dict[str, Any]:
    """MindCluster basic-tor-node-cm ``tor_info``: tor_count = slots per ToR (4), two ToRs."""
    return {
        "version": "1.0",
        "tor_count": 4,
        "server_list": [
            {
                "tor_id": 0,
                "IsSharedTor": 1,
                "tor_ip": "1.0.0.0",
                "server": [
                    {"server_ip": f"1.1.0.{i}", "npu_count": 8, "slice_id": i} for i in range(4)
                ],
            },
            {
                "tor_id": 1,
                "tor_ip": "1.0.0.1",
                "server": [
                    {"server_ip": f"1.1.0.{4 + i}", "npu_count": 8, "slice_id": 3 - i}
                    for i in range(3)
                ],
            },
        ],
    }


def node(name: str, ip: str, labels: Dict[str, str]) -> Dict[str, Any]:
    """A Node as ``GET /api/v1/nodes`` lists it (only the fields we read, plus a few others)."""
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **labels},
            "resourceVersion": "1",
        },
        "spec": {"podCIDR": "172.20.0.0/24"},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ]
        },
    }


def node_list(*nodes: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "kind": "NodeList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "7"},
        "items": list(nodes),
    }


def b64_gzip(document: Any, *, wrap: int = 0) -> bytes:
    """base64(gzip(JSON)) the way the Go plugin writes it, optionally wrapped like ``base64 -w``."""
    text = base64.b64encode(gzip.compress(json.dumps(document).encode()))
    if wrap:
        text = b"\n".join(text[i : i + wrap] for i in range(0, len(text), wrap)) + b"\n"
    return text


def as_json(document: Any) -> bytes:
    return json.dumps(document, indent=2).encode()


def write_cce_job(
    directory: Path, nodes: int, tors: int, *, seed: int = 3, compress_rank_table: bool = False
) -> Tuple[RankTable, Topology, Path]:
    """A generated CCE job as mounted in a pod: ``<dir>/jobstart_hccl.json`` + ``ranktable_tor.json``.

    Returns ``(table, topology, rank table path)`` where ``topology`` is what a pod reads back from
    ``ranktable_tor.json`` (ToRs only: that format carries no slots or outer tiers).
    """
    table, topology = synthetic_cluster(nodes, tors, seed=seed, npus_per_node=2)
    directory.mkdir(parents=True, exist_ok=True)
    document = rank_table_document(table)
    data = b64_gzip(document) if compress_rank_table else as_json(document)
    (directory / "jobstart_hccl.json").write_bytes(data)
    tor_file = encode_ranktable_tor(table, topology)
    (directory / "ranktable_tor.json").write_bytes(tor_file)
    return table, parse_topology(tor_file, "ranktable_tor.json"), directory / "jobstart_hccl.json"


def plain_topology_document(topology: Topology) -> Dict[str, Any]:
    """The plain-file document for ``topology`` (long form for every server; JSON or YAML)."""
    servers: Dict[str, Any] = {}
    for server_id, placement in topology.placements.items():
        entry: Dict[str, Any]
        if len(placement.tors) == 1:
            entry = {"path": [*placement.tiers, placement.tors[0]]}
        else:
            entry = {"path": list(placement.tiers), "tors": list(placement.tors)}
        if placement.slot is not None:
            entry["slot"] = placement.slot
        servers[server_id] = entry
    return {"version": 1, "servers": servers}


# --- the Kubernetes fixtures: kubectl dumps written here (tests/bootstrap/fixtures/kube) ----------

KUBE_FIXTURES = Path(__file__).parent / "fixtures" / "kube"
THREE_TIER = KUBE_FIXTURES / "hypernodes-three-tier.yaml"
NODES = KUBE_FIXTURES / "nodes.json"

_LOADED: Dict[Path, Any] = {}


def kube_document(path: Path) -> Any:
    """A fresh copy of a fixture document (YAML read once: PyYAML is slow)."""
    if path not in _LOADED:
        text = path.read_text()
        _LOADED[path] = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return json.loads(json.dumps(_LOADED[path]))


def nodes_context(names: Optional[Sequence[str]] = None) -> KubeContext:
    """The nodes of ``nodes.json`` beside a topology document, placing only ``names`` if given."""
    return KubeContext(
        objects=decode_objects(NODES.read_bytes(), str(NODES)),
        names=None if names is None else tuple(names),
    )


def node_ip(name: str) -> str:
    """The InternalIP of node ``name`` in ``nodes.json``."""
    return {
        n["metadata"]["name"]: n["status"]["addresses"][0]["address"]
        for n in kube_document(NODES)["items"]
    }[name]
