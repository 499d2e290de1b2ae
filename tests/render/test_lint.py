"""The renderer's warnings: what a valid spec does that will disappoint, one sentence each, saying
what will happen (routing below 3 nodes or without a rank table, part of a node, arrival order,
keys a device ignores)."""

from __future__ import annotations

import pytest

from .conftest import spec_from, with_keys


@pytest.mark.parametrize(
    "extra, expected",
    [
        pytest.param(
            {"nodes": 2, "routing": True},
            ["routing is on with 2 node(s)"],
            id="routing-below-3-nodes",
        ),
        pytest.param(
            {"npus_per_node": 4},
            ["npus_per_node is 4, below a full node (full_node_npus 8)"],
            id="part-of-a-node",
        ),
        pytest.param(
            {"nodes": 3, "npus_per_node": 4},
            [
                "npus_per_node is 4, below a full node (full_node_npus 8); each pod's bootstrap (NPU_JOB_FULL_NODE_DEVICES=8) "
                "will find partial nodes in the rank table, write a failed route_plan.json and keep the scheduler's order"
            ],
            id="part-of-a-node-with-routing",
        ),
        pytest.param(
            {"npus_per_node": 16, "full_node_npus": 16, "nodes": 3},
            [],
            id="a3-full-node-no-warning",
        ),
        pytest.param(
            {"device": "cpu", "full_node_npus": 8},
            ["full_node_npus is ignored for device cpu"],
            id="full-node-on-cpu",
        ),
        pytest.param(
            {"nodes": 4, "launcher": "torchrun", "launcher_args": ["--rdzv_backend=c10d"]},
            ["launcher_args --rdzv_backend=c10d assigns node ranks by arrival"],
            id="arrival-order-launcher",
        ),
        pytest.param(
            {"nodes": 4, "launcher": "npu-run", "launcher_args": ["--rdzv_backend=c10d"]},
            [],
            id="npu-run-ranks-c10d-by-the-reports",
        ),
        pytest.param(
            {"nodes": 4, "launcher": "torchrun", "launcher_args": ["--rdzv-backend", "static"]},
            [],
            id="static-is-fine",
        ),
        pytest.param(
            {"device": "gpu", "hccl": {"connect_timeout": 300}},
            ["hccl settings are ignored for device gpu"],
            id="hccl-on-gpu",
        ),
        pytest.param({"nodes": 6}, [], id="six-full-nodes-no-warning"),
        pytest.param(
            {"nodes": 3, "device": "cpu", "routing": True, "anti_affinity": True},
            [],
            id="routed-cpu-by-the-api",
        ),
        pytest.param(
            {
                "nodes": 3,
                "device": "cpu",
                "routing": True,
                "routing_source": "api",
                "env": {"RANK_TABLE_FILE": "https://x/rt.json"},
            },
            [
                "routing_source is api, but env RANK_TABLE_FILE names a rank table: the bootstrap reads",
                "routing by the Kubernetes API with anti_affinity off",
            ],
            id="routed-cpu-by-the-api-told",
        ),
        pytest.param(
            {"routing_source": "api"},
            ["routing_source is ignored: routing is off"],
            id="routing-source-without-routing",
        ),
        pytest.param(
            {"network_topology": {"mode": "soft", "highest_tier_allowed": 2}},
            ["network_topology.highest_tier_allowed is ignored in soft mode"],
            id="soft-with-a-tier",
        ),
        pytest.param(
            {"nodes": 3, "device": "cpu", "routing": True, "routing_source": "rank-table"},
            [
                "routing is on for device cpu, but no rank table source is configured (CCE's configmap1980 plugin "
                "serves NPU jobs only): set env RANK_TABLE_FILE (a file in one of volumes, or an http(s) URL) or mount "
                "one at /user/config; without it each pod's bootstrap finds no rank table and keeps the scheduler's order"
            ],
            id="routed-cpu-without-rank-table",
        ),
        pytest.param(
            {"nodes": 3, "device": "gpu", "routing": True, "routing_source": "rank-table"},
            ["routing is on for device gpu, but no rank table"],
            id="routed-gpu-without-rank-table",
        ),
        pytest.param(
            {
                "nodes": 3,
                "device": "cpu",
                "routing": True,
                "env": {"RANK_TABLE_FILE": "https://x/rt.json"},
            },
            [],
            id="routed-cpu-rank-table-from-env",
        ),
        pytest.param(
            {
                "nodes": 3,
                "device": "cpu",
                "routing": True,
                "volumes": [{"name": "rt", "configMap": {"name": "rt"}}],
                "mounts": [{"name": "rt", "mountPath": "/user/config"}],
            },
            [],
            id="routed-cpu-rank-table-mounted-where-the-bootstrap-looks",
        ),
        pytest.param(
            {
                "nodes": 3,
                "device": "cpu",
                "routing": True,
                "volumes": [{"name": "rt", "configMap": {"name": "rt"}}],
                "mounts": [{"name": "rt", "mountPath": "/data"}],
                "routing_source": "rank-table",
            },
            ["routing is on for device cpu, but no rank table"],
            id="routed-cpu-volume-elsewhere",
        ),
    ],
)
def test_warnings(extra, expected):
    warnings = spec_from(with_keys(**extra)).warnings
    assert len(warnings) == len(expected), warnings
    for warning, start in zip(warnings, expected):
        assert warning.startswith(start)
