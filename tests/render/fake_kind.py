"""A job kind that exists only in the tests: what render and the demo must do for any kind.

``TrainThing`` (``example.com/v1``) is a made-up controller unlike the Volcano Job wherever a
kind may differ: its pods are ``<job>-<i>`` under subdomain ``<job>`` with a label index and no
group, its container must be called ``trainer`` with ``restartPolicy: Never``, it refuses two
spec keys, injects launcher variables, needs an extra RBAC rule, and its template emits a headless
Service after the job object (render must put the Service first). :func:`register` puts it in
the registry and serves its template the way the package serves the real ones.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Tuple

import pytest
from npu_job.kinds import KINDS
from npu_job.kinds.base import ControllerPod, JobKind, RoleRule, index_suffix, merged, string_pairs
from npu_job.render import render as render_module

NAME = "trainthing"
TEMPLATE = "trainthing.yaml.j2"
JOB_LABEL = "example.com/job"
INDEX_LABEL = "example.com/index"
INDEX_ENV = "THING_INDEX"

TEMPLATE_TEXT = """\
apiVersion: "example.com/v1"
kind: "TrainThing"
metadata:
  name: {{ spec.name|tojson }}
  namespace: {{ spec.namespace|tojson }}
spec:
  replicas: {{ spec.nodes|tojson }}
  template:
    {{ pod_template|indent(4) }}
---
apiVersion: "v1"
kind: "Service"
metadata:
  name: {{ spec.name|tojson }}
  namespace: {{ spec.namespace|tojson }}
spec:
  clusterIP: "None"
  selector:
    {{ kind.job_label|tojson }}: {{ spec.name|tojson }}
"""


class TrainThing(JobKind):
    name = NAME
    title = "TrainThing"
    api_version = "example.com/v1"
    kind = "TrainThing"
    template = TEMPLATE
    source = "tests/render/fake_kind.py"
    job_label = JOB_LABEL
    index_label = INDEX_LABEL
    index_env = INDEX_ENV
    container_name = "trainer"
    restart_policy = "Never"
    refused_keys = (
        ("queue", "a TrainThing is queued by no one"),
        ("network_topology", "the network-topology constraint is the Volcano Job's"),
    )
    role_rules = (RoleRule("example.com", "trainthings", ("get", "list")),)
    # MASTER_ADDR is train.sh's own: listed, it is overwritten there, never unset
    launcher_env = ("PET_NODE_RANK", "PET_MASTER_ADDR", "RANK", "WORLD_SIZE", "MASTER_ADDR")

    def index_from_name(self, name: str) -> Any:
        return index_suffix(name)

    def dns_name(self, job: str, group: str, index: int) -> str:
        return f"{job}-{index}.{job}"

    def master_address_bash(self) -> str:
        return 'MASTER_ADDR="${MA_VJ_NAME}-${MA_MASTER_INDEX}.${MA_VJ_NAME}"'

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        job = job_object["metadata"]["name"]
        template = job_object["spec"]["template"]
        meta = template.get("metadata") or {}
        pods = []
        for index in range(job_object["spec"]["replicas"]):
            name = f"{job}-{index}"
            own = ((JOB_LABEL, job), (INDEX_LABEL, str(index)))
            pods.append(
                ControllerPod(
                    index=index,
                    name=name,
                    hostname=name,
                    subdomain=job,
                    labels=merged(string_pairs(meta.get("labels")), own),
                    annotations=string_pairs(meta.get("annotations")),
                    env=((INDEX_ENV, str(index)), ("PET_NODE_RANK", "7"), ("RANK", "9")),
                    template=template,
                    where="spec.template",
                    dns_names=(self.dns_name(job, "", index),),
                )
            )
        return tuple(pods)


def register(monkeypatch: pytest.MonkeyPatch) -> Iterator[JobKind]:
    """The fake kind in the registry, its template served as package data (a test module's
    fixture yields from it)."""
    kind = TrainThing()
    monkeypatch.setitem(KINDS, NAME, kind)
    real = render_module._package_text
    monkeypatch.setattr(
        render_module,
        "_package_text",
        lambda name, *package: TEMPLATE_TEXT if name == TEMPLATE else real(name, *package),
    )
    yield kind
