"""Job spec validation: one precise problem per bad value, all problems at once, and null from
every input (the defaults are the key table's: test_keys.py; the warnings lint's: test_lint.py)."""

from __future__ import annotations

import re

import pytest
from npu_job.render.values import SpecInput, merge_values, parse_set

from npu_job.errors import SpecError

from .conftest import MINIMAL, NULL_MEANINGS, spec_from, with_keys

BAD_SPECS = [
    # (id, values change, expected problem text: a regex of the single problem)
    ("missing-name", {"name": None}, r"^name: required key is missing$"),
    ("missing-image", {"image": None}, r"^image: required key is missing$"),
    ("missing-script", {"script": None}, r"^script: required key is missing$"),
    (
        "unknown-key-did-you-mean",
        {"npu_per_node": 8},
        r"^npu_per_node: unknown key \(did you mean 'npus_per_node'\?\)$",
    ),
    ("unknown-key-listed", {"zzz": 1}, r"^zzz: unknown key \(known keys: .*name.*\)$"),
    (
        "unknown-nested-key",
        {"hccl": {"connect_timout": 300}},
        r"^hccl\.connect_timout: unknown key \(did you mean 'connect_timeout'\?\)$",
    ),
    (
        "name-uppercase",
        {"name": "My_Job"},
        r"^name: 'My_Job' is not a DNS-1123 label: .*at most 63 characters$",
    ),
    ("name-trailing-dash", {"name": "job-"}, r"^name: 'job-' is not a DNS-1123 label"),
    (
        "name-too-long-for-pods",
        {"name": "a" * 55, "nodes": 12},
        r"^name: too long for the pod names: 'a{55}-worker-11' has 65 characters",
    ),
    ("name-not-string", {"name": 12}, r"^name: expected a string, got 12 \(a number\)"),
    ("nodes-zero", {"nodes": 0}, r"^nodes: expected an integer from 1 to 100000, got 0$"),
    ("nodes-boolean", {"nodes": True}, r"^nodes: expected an integer, got true \(a boolean\)$"),
    ("nodes-text", {"nodes": "six"}, r"^nodes: expected an integer, got 'six'$"),
    (
        "npus-too-many",
        {"npus_per_node": 32},
        r"^npus_per_node: expected an integer from 1 to 16, got 32$",
    ),
    (
        "npus-more-than-a-full-node",
        {"npus_per_node": 16},
        r"^npus_per_node: 16 is more than a full node \(full_node_npus 8\); on nodes with 16 accelerators \(e\.g\. Atlas A3\) set full_node_npus: 16$",
    ),
    (
        "full-node-range",
        {"full_node_npus": 32},
        r"^full_node_npus: expected an integer from 1 to 16, got 32$",
    ),
    (
        "env-full-node-reserved",
        {"env": {"NPU_JOB_FULL_NODE_DEVICES": "4"}},
        r"^env\.NPU_JOB_FULL_NODE_DEVICES: reserved: use the full_node_npus key$",
    ),
    (
        "device-typo",
        {"device": "nup"},
        r"^device: expected one of npu, gpu, cpu; got 'nup' \(did you mean 'npu'\?\)$",
    ),
    (
        "launcher-unknown",
        {"launcher": "torch-run"},
        r"^launcher: expected one of npu-run, torchrun, torch.distributed.launch; got 'torch-run' \(did you mean 'torchrun'\?\)$",
    ),
    (
        "routing-not-bool",
        {"routing": "yes please"},
        r"^routing: expected true or false, got 'yes please'$",
    ),
    (
        "tiered-store-with-torchrun",
        {"launcher": "torchrun", "tiered_store": True},
        r"^tiered_store: the tiered store needs launcher npu-run; launcher is torchrun$",
    ),
    (
        "probe-with-torchrun",
        {"launcher": "torchrun", "probe": True},
        r"^probe: the probe needs launcher npu-run; launcher is torchrun$",
    ),
    (
        "probe-without-the-parallel-rendezvous",
        {"tiered_store": False, "probe": 30},
        r"^probe: the probe needs npu-run's parallel rendezvous: set tiered_store: true",
    ),
    (
        "probe-not-seconds",
        {"probe": "soon"},
        r"^probe: expected true, false or an integer of seconds from 1 to 3600, got 'soon'$",
    ),
    (
        "probe-seconds-range",
        {"probe": 0},
        r"^probe: expected an integer from 1 to 3600, got 0$",
    ),
    (
        "master-port-range",
        {"master_port": 70000},
        r"^master_port: expected an integer from 1 to 65535, got 70000$",
    ),
    (
        "master-port-in-hccl-range",
        {"master_port": 60003},
        r"^master_port: 60003 collides with HCCL's ports 60000-60015",
    ),
    (
        "hccl-timeout-range",
        {"hccl": {"connect_timeout": 5}},
        r"^hccl\.connect_timeout: expected an integer from 120 to 7200, got 5$",
    ),
    (
        "hccl-reserve-in-host-network",
        {"hccl": {"reserve_ports": True}, "host_network": True},
        r"^hccl\.reserve_ports: a pod in the host network cannot set net\.\* sysctls",
    ),
    ("hccl-not-mapping", {"hccl": 300}, r"^hccl: expected a mapping, got 300 \(a number\)$"),
    ("args-not-list", {"args": "--lr 0.1"}, r"^args: expected a list, got '--lr 0.1'$"),
    ("env-bad-name", {"env": {"1BAD": "x"}}, r"^env\.1BAD: not a valid variable name"),
    (
        "env-reserved",
        {"env": {"MASTER_ADDR": "x"}},
        r"^env\.MASTER_ADDR: reserved: computed by train.sh$",
    ),
    (
        "env-hccl-reserved",
        {"env": {"HCCL_CONNECT_TIMEOUT": "9"}},
        r"^env\.HCCL_CONNECT_TIMEOUT: reserved: use the hccl.connect_timeout key$",
    ),
    ("env-not-mapping", {"env": ["A=1"]}, r"^env: expected a mapping, got a list$"),
    ("namespace-bad", {"namespace": "Prod"}, r"^namespace: 'Prod' is not a DNS-1123 label"),
    ("queue-bad", {"queue": "q_1"}, r"^queue: 'q_1' is not a DNS-1123 subdomain"),
    ("workdir-relative", {"workdir": "code"}, r"^workdir: 'code' is not an absolute path"),
    (
        "scripts-dir-shell-chars",
        {"scripts_dir": "/opt/$(x)"},
        r"^scripts_dir: '/opt/\$\(x\)' is not an absolute path of letters",
    ),
    ("label-value-bad", {"labels": {"team": "a b"}}, r"^labels\.team: 'a b' is not a label value"),
    ("label-key-bad", {"labels": {"-bad": "x"}}, r"^labels\.-bad: not a valid key"),
    (
        "label-routing-owned",
        {"nodes": 3, "labels": {"ring-controller.cce": "x"}},
        r"^labels\.ring-controller\\\.cce: set by npu-job for routing",
    ),
    (
        "resources-bad-quantity",
        {"resources": {"memory": "lots"}},
        r"^resources\.memory: 'lots' is not a Kubernetes quantity",
    ),
    (
        "resources-unknown",
        {"resources": {"gpu": 8}},
        r"^resources\.gpu: unknown key \(accelerators are requested from device and npus_per_node\)$",
    ),
    (
        "mount-without-path",
        {"volumes": [{"name": "d", "emptyDir": {}}], "mounts": [{"name": "d"}]},
        r"^mounts\[0\]\.mountPath: required key is missing$",
    ),
    (
        "volume-without-source",
        {"volumes": [{"name": "data"}]},
        r"^volumes\[0\]: expected a volume source beside 'name'",
    ),
    (
        "volume-reserved-name",
        {"volumes": [{"name": "dshm", "emptyDir": {}}]},
        r"^volumes\[0\]\.name: 'dshm' is used by npu-job itself",
    ),
    (
        "mount-unknown-volume",
        {
            "volumes": [{"name": "data", "emptyDir": {}}],
            "mounts": [{"name": "dta", "mountPath": "/d"}],
        },
        r"^mounts\[0\]\.name: 'dta' is not a volume in volumes \(did you mean 'data'\?\)$",
    ),
    (
        "mount-over-driver",
        {
            "volumes": [{"name": "d", "emptyDir": {}}],
            "mounts": [{"name": "d", "mountPath": "/usr/local/Ascend/driver"}],
        },
        r"^mounts\[0\]\.mountPath: '/usr/local/Ascend/driver' is mounted by npu-job itself$",
    ),
    (
        "mount-key-typo",
        {"volumes": [{"name": "d", "emptyDir": {}}], "mounts": [{"name": "d", "mount_path": "/d"}]},
        r"^mounts\[0\]\.mount_path: unknown key \(did you mean 'mountPath'\?\)$",
    ),
    (
        "pull-policy-typo",
        {"image_pull_policy": "ifnotpresent"},
        r"^image_pull_policy: expected one of .*got 'ifnotpresent' \(did you mean 'IfNotPresent'\?\)$",
    ),
    (
        "bootstrap-url-scheme",
        {"bootstrap": {"url": "ftp://x/b.sh"}},
        r"^bootstrap\.url: 'ftp://x/b.sh' is not an http:// or https:// URL",
    ),
    (
        "pip-install-option",
        {"pip_install": ["-r", "req.txt"]},
        r"^pip_install\[0\]: '-r' is not a pip requirement",
    ),
    ("image-with-space", {"image": "a b"}, r"^image: 'a b' is not an image reference"),
    (
        "max-retry-negative",
        {"max_retry": -1},
        r"^max_retry: expected an integer from 0 to 2147483647, got -1$",
    ),
]


@pytest.mark.parametrize("change, expected", [pytest.param(c, e, id=i) for i, c, e in BAD_SPECS])
def test_each_bad_spec_gives_one_precise_problem(change, expected):
    values = dict(MINIMAL)
    for key, value in change.items():
        if value is None:
            values.pop(key)
        else:
            values[key] = value
    with pytest.raises(SpecError) as error:
        spec_from(values)
    assert error.value.exit_code == 5
    assert len(error.value.problems) == 1, error.value.problems
    assert re.search(expected, error.value.problems[0]), error.value.problems[0]
    assert error.value.message.startswith("job.yaml: ")


def test_all_problems_are_listed_at_once_with_their_origin():
    inputs = [
        SpecInput("job.yaml", values={"name": "Bad", "image": "i", "nodes": 0}),
        SpecInput("--set", assignments=parse_set("device=tpu,scritp=x")),
    ]
    with pytest.raises(SpecError) as error:
        from npu_job.render.spec import validate

        validate(merge_values(inputs))
    problems = error.value.problems
    assert problems == (
        "scritp (from --set): unknown key (did you mean 'script'?)",
        "device (from --set): expected one of npu, gpu, cpu; got 'tpu' (did you mean 'npu'?)",
        "name (from job.yaml): 'Bad' is not a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters",
        "nodes (from job.yaml): expected an integer from 1 to 100000, got 0",
    )
    assert error.value.message.startswith("job.yaml + --set: 4 problems:\n  - scritp")


@pytest.mark.parametrize("doc", [pytest.param(doc, id=doc.key) for doc in NULL_MEANINGS])
@pytest.mark.parametrize(
    "layers",
    [
        pytest.param(
            lambda key: [SpecInput("job.yaml", values=with_keys(**{key: None}))],
            id="null-in-the-spec",
        ),
        pytest.param(
            lambda key: [
                SpecInput("job.yaml", values=with_keys(**{key: "1Gi"})),
                SpecInput("prod.yaml", values={key: None}),
            ],
            id="null-in-an-f-file",
        ),
        pytest.param(
            lambda key: [
                SpecInput("job.yaml", values=with_keys(**{key: "1Gi"})),
                SpecInput("--set", assignments=parse_set(f"{key}=null")),
            ],
            id="null-from-set",
        ),
    ],
)
def test_null_of_a_key_with_a_null_meaning_reaches_the_spec_from_every_input(doc, layers):
    from npu_job.render.spec import validate

    assert getattr(validate(merge_values(layers(doc.key))), doc.key) is None


def test_a_value_after_a_null_wins_and_null_elsewhere_means_the_default():
    from npu_job.render.spec import validate

    inputs = [
        SpecInput("job.yaml", values=with_keys(shm_size=None, queue="q", routing=False, nodes=3)),
        SpecInput("--set", assignments=parse_set("shm_size=2Gi,queue=null,routing=null")),
    ]
    spec = validate(merge_values(inputs))
    assert (spec.shm_size, spec.queue, spec.routing) == ("2Gi", "default", True)
