"""The key table: each key's default (one value, one per device, or derived from other keys),
every key it documents accepted by validation, and a null meaning only where null differs from the
default."""

from __future__ import annotations

import pytest
from npu_job.render.keys import SPEC_KEYS
from npu_job.render.spec import JobSpec

from .conftest import MINIMAL, NULL_MEANINGS, spec_from, with_keys


def test_defaults_of_a_minimal_spec():
    spec = spec_from(dict(MINIMAL))
    assert spec == JobSpec(name="demo", image="registry.example.com/train:1", script="train.py")
    assert (spec.nodes, spec.npus_per_node, spec.device, spec.launcher) == (1, 8, "npu", "npu-run")
    assert (spec.routing, spec.tiered_store, spec.master_port, spec.max_retry) == (
        False,
        True,
        29500,
        3,
    )
    assert (spec.hccl.connect_timeout, spec.hccl.base_port) == (1200, 60000)


@pytest.mark.parametrize(
    "extra, routing",
    [
        pytest.param({"nodes": 2}, False, id="2-nodes-off"),
        pytest.param({"nodes": 3}, True, id="3-nodes-on"),
        pytest.param({"nodes": 3, "routing": False}, False, id="explicitly-off"),
        pytest.param({"nodes": 1, "routing": True}, True, id="explicitly-on"),
        pytest.param({"nodes": 4, "device": "gpu"}, False, id="gpu-off"),
        pytest.param({"nodes": 4, "device": "cpu"}, False, id="cpu-off"),
        pytest.param({"nodes": 4, "device": "gpu", "routing": True}, True, id="gpu-explicitly-on"),
        pytest.param({"nodes": 4, "device": "cpu", "routing": True}, True, id="cpu-explicitly-on"),
    ],
)
def test_routing_defaults_to_on_from_3_npu_nodes(extra, routing):
    assert spec_from(with_keys(**extra)).routing is routing


def test_device_dependent_defaults():
    cpu = spec_from(with_keys(device="cpu"))
    assert (cpu.npus_per_node, cpu.anti_affinity, cpu.resource_name) == (1, False, None)
    gpu = spec_from(with_keys(device="gpu"))
    assert (gpu.npus_per_node, gpu.anti_affinity, gpu.resource_name) == (8, True, "nvidia.com/gpu")


def test_every_documented_key_is_accepted():
    """SPEC_KEYS is the README's key table: each key in it must be a key the validator knows."""
    documented = {doc.key.split(".")[0] for doc in SPEC_KEYS}
    values = with_keys(nodes=3)
    samples = {
        "args": ["a"],
        "nodes": 3,
        "npus_per_node": 8,
        "full_node_npus": 8,
        "device": "npu",
        "kind": "volcano",
        "namespace": "ns",
        "queue": "q",
        "task_name": "trainer",
        "workdir": "/w",
        "env": {"A": "1"},
        "routing": True,
        "launcher": "npu-run",
        "launcher_args": ["--max_restarts=0"],
        "tiered_store": True,
        "master_port": 29400,
        "hccl": {"connect_timeout": 600, "base_port": 61000, "reserve_ports": False},
        "volumes": [{"name": "v", "emptyDir": {}}],
        "mounts": [{"name": "v", "mountPath": "/v"}],
        "max_retry": 1,
        "restart": "pod",
        "priority_class": "high",
        "node_selector": {"k": "v"},
        "labels": {"team": "x"},
        "annotations": {"note": "x y"},
        "resources": {"cpu": "1", "memory": "1Gi"},
        "image_pull_policy": "Always",
        "image_pull_secrets": ["s"],
        "shm_size": "1Gi",
        "host_network": True,
        "anti_affinity": False,
        "scripts_dir": "/opt/x",
        "bootstrap": {"url": "https://example.com/bootstrap.sh"},
        "pip_install": "npu-job==0.1.0",
        "bundle": False,
        "routing_source": "api",
        "service_account": "trainer",
        "network_topology": {"mode": "hard", "highest_tier_allowed": 2},
        "probe": 30,
    }
    assert documented - {"name", "image", "script"} == set(samples)
    values.update(samples)
    spec = spec_from(values)
    assert spec.hccl.base_port == 61000 and spec.bootstrap_url == "https://example.com/bootstrap.sh"
    assert spec.pip_install == ("npu-job==0.1.0",) and spec.bundle is False
    assert (
        spec.network_topology.highest_tier_allowed == 2
        and spec.routing_service_account == "trainer"
    )


def test_keys_that_give_null_a_meaning_are_the_documented_ones():
    """A null meaning is only needed where null differs from the default; today that is shm_size."""
    assert [doc.key for doc in NULL_MEANINGS] == ["shm_size"]
    for doc in NULL_MEANINGS:
        assert getattr(JobSpec(name="n", image="i", script="s"), doc.key) is not None, (
            "null must differ from the default"
        )
