"""Render reads the job kind's record: the spec key ``kind``, the keys a kind refuses, the shared
pod template with the kind's own parts, train.sh's index, master address and launcher variables,
the RBAC's extra rules and the stream's order.

What any kind gets is checked with a kind made for the tests (``fake_kind.TrainThing``), unlike
the Volcano Job wherever a kind may differ; the Volcano Job's own output is the golden files'
(test_golden.py). The last tests hold every registered kind's record to what the templates assume
of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from npu_job.kinds import KINDS
from npu_job.render.keys import KEYS
from npu_job.render.render import render

from npu_job.errors import SpecError

from . import fake_kind
from .conftest import BUNDLE_STAND_IN, parsed, render_values, spec_from, with_keys
from .fake_kind import INDEX_ENV, JOB_LABEL, NAME, TEMPLATE
from .test_scripts import assert_clean_shell

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@pytest.fixture
def registered(monkeypatch):
    yield from fake_kind.register(monkeypatch)


def known():
    """The kinds an unknown one is told of: every registered kind, the tests' own among them."""
    assert NAME in KINDS and "volcano" in KINDS
    return ", ".join(sorted(KINDS))


def problems_of(values, *sets):
    with pytest.raises(SpecError) as error:
        spec_from(values, *sets)
    return error.value.problems


def job_object(rendered):
    kind = rendered.spec.job_kind
    (job,) = [
        doc
        for doc in parsed(rendered)
        if (doc["apiVersion"], doc["kind"]) == (kind.api_version, kind.kind)
    ]
    return job


# --- the spec key ----------------------------------------------------------------------------


def test_the_default_kind_is_volcano_and_an_unknown_kind_lists_the_known(registered):
    assert spec_from(with_keys()).kind == "volcano" == KEYS["kind"].default
    # a name no kind is near (pytorch would suggest pytorchjob)
    assert problems_of(with_keys(kind="slurm")) == (
        f"kind: expected one of {known()}; got 'slurm'",
    )
    assert problems_of(with_keys(kind="trainthin")) == (
        f"kind: expected one of {known()}; got 'trainthin' (did you mean '{NAME}'?)",
    )


def test_a_key_the_kind_refuses_is_a_problem_only_when_given(registered):
    assert spec_from(with_keys(kind=NAME)).queue == "default"  # its default is no problem
    found = problems_of(
        with_keys(kind=NAME, queue="q", nodes=2),
        "network_topology.mode=soft",
    )
    assert found == (
        "queue (from job.yaml): the TrainThing (kind trainthing) cannot honour it: a TrainThing "
        "is queued by no one; remove it or choose another kind",
        "network_topology.mode (from --set): the TrainThing (kind trainthing) cannot honour it: "
        "the network-topology constraint is the Volcano Job's; remove it or choose another kind",
    )
    # the Volcano Job honours both
    assert spec_from(with_keys(queue="q"), "network_topology.mode=soft").queue == "q"


def test_an_unknown_kind_is_its_only_problem_not_a_refusal_of_the_default_kinds(
    registered, monkeypatch
):
    monkeypatch.setattr(type(KINDS["volcano"]), "refused_keys", (("queue", "say it refuses"),))
    assert problems_of(with_keys(queue="q"))[0].startswith("queue: the Volcano Job")
    assert problems_of(with_keys(kind="slurm", queue="q")) == (
        f"kind: expected one of {known()}; got 'slurm'",
    )


def test_the_env_may_not_set_what_the_kinds_controller_sets(registered):
    assert problems_of(with_keys(kind=NAME, env={INDEX_ENV: "1", "PET_NODE_RANK": "0"})) == (
        f"env.{INDEX_ENV}: set in every pod by the TrainThing's controller (kind trainthing); "
        "remove it",
        "env.PET_NODE_RANK: set in every pod by the TrainThing's controller (kind trainthing); "
        "remove it",
    )
    assert spec_from(with_keys(env={INDEX_ENV: "1"})).env == ((INDEX_ENV, "1"),)
    assert problems_of(with_keys(env={"VC_TASK_INDEX": "1"})) == (
        "env.VC_TASK_INDEX: set in every pod by the Volcano Job's controller (kind volcano); "
        "remove it",
    )


# --- the stream, the pod template, the RBAC ---------------------------------------------------


@pytest.fixture
def thing(registered):
    """A routed CPU job of the fake kind that routes by the API (so render emits its RBAC)."""
    return render_values(with_keys(name="tt", kind=NAME, device="cpu", nodes=3, routing=True))


def test_the_stream_is_configmap_rbac_service_then_the_job_object(thing):
    assert [(doc.kind, doc.source.rsplit("/", 1)[1]) for doc in thing.documents] == [
        ("ConfigMap", "configmap.yaml.j2"),
        ("ServiceAccount", "rbac.yaml.j2"),
        ("Role", "rbac.yaml.j2"),
        ("RoleBinding", "rbac.yaml.j2"),
        ("ClusterRole", "rbac.yaml.j2"),
        ("ClusterRoleBinding", "rbac.yaml.j2"),
        ("Service", TEMPLATE),  # the kind's template emits it after the job object
        ("TrainThing", TEMPLATE),
    ]
    assert thing.job.kind == "TrainThing" and thing.job.api_version == "example.com/v1"


def test_a_kind_template_without_its_job_object_is_a_render_error(registered, monkeypatch):
    from npu_job.errors import RenderError

    monkeypatch.setattr(type(registered), "api_version", "example.com/v2")
    with pytest.raises(RenderError, match=f"templates/{TEMPLATE}: expected one example.com/v2"):
        render_values(with_keys(kind=NAME))


def test_the_role_has_the_kinds_extra_rules_after_listing_pods(thing):
    (role,) = [doc for doc in parsed(thing) if doc["kind"] == "Role"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["example.com"], "resources": ["trainthings"], "verbs": ["get", "list"]},
    ]


def volcano_and_thing_pods(**keys):
    """The pod template of one spec rendered as a Volcano Job and as the fake kind."""
    volcano = job_object(render_values(with_keys(**keys)))["spec"]["tasks"][0]["template"]
    thing = job_object(render_values(with_keys(kind=NAME, **keys)))["spec"]["template"]
    return volcano, thing


def test_every_kind_places_the_same_pod_template_with_its_own_parts(registered):
    # routed by the API alike (CCE delivers rank tables to the Volcano Job's NPU pods only)
    volcano, thing = volcano_and_thing_pods(
        nodes=4,
        anti_affinity=True,
        labels={"team": "a"},
        env={"A": "1"},
        priority_class="p",
        routing_source="api",
    )
    term = thing["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ][0]
    assert term["labelSelector"]["matchExpressions"][0]["key"] == JOB_LABEL
    (container,) = thing["spec"]["containers"]
    assert container["name"] == "trainer" and thing["spec"]["restartPolicy"] == "Never"
    env = {item["name"]: item for item in container["env"]}
    assert env["MA_VJ_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        f"metadata.labels['{JOB_LABEL}']"
    )
    assert "MA_TASK_NAME" not in env  # the kind has no group label
    assert env["NPU_JOB_KIND"] == {"name": "NPU_JOB_KIND", "value": NAME}
    assert f"export RANK_AFTER_ACC=${{{INDEX_ENV}}};" in container["command"][-1]
    # everything else is the one pod template
    for pod in (volcano, thing):
        pod["spec"].pop("affinity")
        pod["spec"].pop("restartPolicy")
        (only,) = pod["spec"].pop("containers")
        only.pop("name")
        only["env"] = [
            item
            for item in only["env"]
            if item["name"] not in ("MA_VJ_NAME", "MA_TASK_NAME", "NPU_JOB_KIND")
        ]
        only["command"][-1] = only["command"][-1].replace(INDEX_ENV, "VC_TASK_INDEX")
        pod["container"] = only
    assert thing == volcano


def test_the_volcano_pods_carry_no_kind_variable():
    env = job_object(render_values(with_keys()))["spec"]["tasks"][0]["template"]["spec"][
        "containers"
    ][0]["env"]
    assert "NPU_JOB_KIND" not in {item["name"] for item in env}


def test_the_shared_pod_template_is_placed_line_by_line_whatever_a_value_holds(registered):
    """Jinja's ``indent``, which places the pod template, splits lines at every Unicode line
    break: the values' own (escaped by ``tojson``) never reach it, and read back exact."""
    hostile = "a\u2028b\u0085c\rd\x0ce\x1cf"
    _, thing = volcano_and_thing_pods(env={"HOSTILE": hostile}, annotations={"x": hostile})
    env = {item["name"]: item.get("value") for item in thing["spec"]["containers"][0]["env"]}
    assert env["HOSTILE"] == hostile and thing["metadata"]["annotations"]["x"] == hostile


# --- train.sh ------------------------------------------------------------------------------------

ENV_REPORT = """#!{python}
import json, os, sys
print(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}))
"""


def run_train_sh(rendered, tmp_path: Path, env):
    """train.sh as a pod runs it, with a fake npu-run first on PATH that reports argv and env."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-run").write_text(ENV_REPORT.format(python=sys.executable))
    (bin_dir / "npu-run").chmod(0o755)
    script = tmp_path / "train.sh"
    script.write_text(dict(rendered.scripts)["train.sh"])
    done = subprocess.run(
        ["bash", str(script)],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_train_sh_reads_the_kinds_index_and_master_rule_and_unsets_its_launcher_variables(
    registered, tmp_path
):
    rendered = render_values(with_keys(name="tt", kind=NAME, nodes=4, bundle=False))
    controller = {
        INDEX_ENV: "2",
        "MA_VJ_NAME": "tt",
        "MA_MASTER_INDEX": "3",
        "PET_NODE_RANK": "7",
        "PET_MASTER_ADDR": "elsewhere",
        "RANK": "9",
        "WORLD_SIZE": "99",
        "MASTER_ADDR": "elsewhere",
    }
    report = run_train_sh(rendered, tmp_path, controller)
    argv = report["argv"]
    assert argv[argv.index("--node_rank") + 1] == "2"  # no plan: the kind's index
    # npu-run's parallel rendezvous: its root on pod index 0, the kind's DNS name of that pod
    assert argv[argv.index("--master_addr") + 1] == "tt-0.tt"
    env = report["env"]
    assert not {"PET_NODE_RANK", "PET_MASTER_ADDR", "RANK", "WORLD_SIZE"} & set(env)
    assert env["MASTER_ADDR"] == "tt-0.tt" and env["NODE_RANK"] == "2"
    # without it (node rank 0 hosts the store), the kind's rule for the master's pod
    static = render_values(
        with_keys(name="tt", kind=NAME, nodes=4, bundle=False, tiered_store=False)
    )
    static_dir = tmp_path / "static"
    static_dir.mkdir()
    assert run_train_sh(static, static_dir, controller)["env"]["MASTER_ADDR"] == "tt-3.tt"


def test_train_sh_of_a_kind_stops_when_its_identity_variable_is_missing(registered, tmp_path):
    rendered = render_values(with_keys(kind=NAME, bundle=False))
    (tmp_path / "train.sh").write_text(dict(rendered.scripts)["train.sh"])
    done = subprocess.run(
        ["bash", str(tmp_path / "train.sh")],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"MA_VJ_NAME: is set by the Job from the label {JOB_LABEL}" in done.stderr


@pytest.mark.parametrize("name", [*sorted(KINDS), NAME])
def test_every_kinds_scripts_pass_bash_n_and_shellcheck(name, registered, tmp_path):
    rendered = render_values(with_keys(kind=name, nodes=3, env={"A": "$(b)"}))
    assert_clean_shell(rendered, tmp_path)


# --- every registered kind's record, as the templates use it --------------------------------


@pytest.mark.parametrize("name", sorted(KINDS))
def test_what_the_templates_take_from_a_kinds_record_is_plain_text(name):
    """The index and launcher variables reach bash unquoted and the pod command, which the
    kubelet's $(VAR) expansion reads too: names only."""
    kind = KINDS[name]
    assert _ENV_NAME.match(kind.index_env), kind.index_env
    assert all(_ENV_NAME.match(variable) for variable in kind.launcher_env), kind.launcher_env
    assert all(_ENV_NAME.match(variable.name) for variable in kind.identity_env())
    assert kind.identity_metadata in ("labels", "annotations")
    assert kind.template and kind.api_version and kind.kind and kind.job_label


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_kinds_master_address_is_the_dns_name_of_the_master_pod(name, tmp_path):
    """train.sh's master address rule, run by bash with the identity variables a pod of the kind
    gets (read from the pod the kind's controller makes), names that pod (when it has a DNS
    name; a kind without one tests its own rule)."""
    rendered = render(spec_from(with_keys(name="job", kind=name, nodes=3)), bundle=BUNDLE_STAND_IN)
    kind = rendered.spec.job_kind
    pods = kind.stream_pods(parsed(rendered), "job")
    master = pods[-1]
    if not master.dns_names:
        pytest.skip(f"{kind.title} pods have no DNS name")
    metadata = {"labels": dict(master.labels), "annotations": dict(master.annotations)}
    env = {
        variable.name: metadata[variable.metadata][variable.key] for variable in kind.identity_env()
    }
    script = "set -euo pipefail\n" + kind.master_address_bash() + '\nprintf %s "$MASTER_ADDR"\n'
    done = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": os.environ["PATH"], "MA_MASTER_INDEX": str(master.index), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout in master.dns_names
