"""The TrainJob and the TrainingRuntime it runs on, as rendered, hold only fields their CRDs list,
of the CRDs' types, and the runtime is what the Trainer's webhook accepts.

The schemas below are minimal ones written by hand from the CRDs of
``trainer.kubeflow.org/v1alpha1`` ``TrainJob`` and ``TrainingRuntime`` (kubeflow/trainer
``manifests/base/crds/`` at 8c0f5059b): the fields npu-job renders with the CRDs' constraints on
them (the TrainJob's name rule is a CEL rule there, a pattern here), closed wherever the CRDs list
properties (``strict_schema.closed``), so a field the API server would prune fails here.
"""

from __future__ import annotations

import pytest
import yaml
from npu_job.kinds import KINDS

from npu_job.errors import SpecError

from .conftest import EXAMPLES, as_kind, parsed, render_values, spec_from, with_keys
from .strict_schema import (
    OBJECT_META,
    assert_strict,
    integer,
    obj,
    open_object,
    string,
    string_map,
)
from .test_kind_jobset import INT32, JOBSET_SPEC, OPTIONAL_PIECES

TRAINJOB = KINDS["trainjob"]

TRAINING_RUNTIME_SCHEMA = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("trainer.kubeflow.org/v1alpha1",)),
    kind=string(enum=("TrainingRuntime",)),
    metadata=OBJECT_META,
    spec=obj(
        mlPolicy=obj(numNodes=integer(**INT32), torch=obj(envInjection=open_object())),
        template=obj(metadata=obj(labels=string_map(), annotations=string_map()), spec=JOBSET_SPEC),
    ),
)
TRAINJOB_SCHEMA = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("trainer.kubeflow.org/v1alpha1",)),
    kind=string(enum=("TrainJob",)),
    metadata=obj(
        required=("name",),
        name=string(pattern="^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=63),
        namespace=string(),
        labels=string_map(),
        annotations=string_map(),
    ),
    spec=obj(
        required=("runtimeRef",),
        runtimeRef=obj(
            required=("name",),
            apiGroup=string(max_length=253),
            kind=string(max_length=253),
            name={**string(max_length=253), "minLength": 1},
        ),
        trainer=obj(
            numNodes=integer(minimum=0, maximum=INT32["maximum"]),
            numProcPerNode=integer(minimum=1, maximum=INT32["maximum"]),
        ),
    ),
)


def objects(rendered):
    """The rendered stream's TrainingRuntime and TrainJob, in stream order."""
    return [
        doc
        for doc in yaml.safe_load_all(rendered.stream())
        if doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    ]


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_examples_runtime_and_trainjob_hold_only_what_their_crds_list(name):
    runtime, trainjob = objects(as_kind(name, "trainjob"))
    assert_strict(runtime, TRAINING_RUNTIME_SCHEMA, f"{name}: the TrainingRuntime")
    assert_strict(trainjob, TRAINJOB_SCHEMA, f"{name}: the TrainJob")


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_examples_trainjob_runs_on_the_runtime_before_it_as_the_trainer_accepts(name):
    rendered = as_kind(name, "trainjob")
    spec = rendered.spec
    kinds = [doc["kind"] for doc in parsed(rendered)]
    assert kinds[-2:] == ["TrainingRuntime", "TrainJob"]  # the runtime exists first
    runtime, trainjob = objects(rendered)
    assert trainjob["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": runtime["metadata"]["name"],
    }
    assert runtime["metadata"]["namespace"] == trainjob["metadata"]["namespace"] == spec.namespace
    assert trainjob["spec"]["trainer"] == {
        "numNodes": spec.nodes,
        "numProcPerNode": spec.npus_per_node,  # the Trainer would count GPUs or CPUs, not NPUs
    }
    assert runtime["spec"]["mlPolicy"] == {"numNodes": spec.nodes, "torch": {}}
    # the Trainer's webhook: the trainer step is one replica with a container named node
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert (rjob["name"], rjob["replicas"]) == ("node", 1)
    labels = rjob["template"]["metadata"]["labels"]
    assert labels == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    pod = rjob["template"]["spec"]["template"]["spec"]
    assert [container["name"] for container in pod["containers"]] == ["node"]
    assert pod["restartPolicy"] == TRAINJOB.restart_policy
    assert runtime["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": spec.max_retry}
    # the record reads what the template rendered: one pod per node, each named as it says
    pods = TRAINJOB.stream_pods(parsed(rendered), name)
    assert [p.dns_names[0] for p in pods] == [
        TRAINJOB.dns_name(spec.name, "", index) for index in range(spec.nodes)
    ]


@pytest.mark.parametrize("piece", sorted(OPTIONAL_PIECES))
def test_every_optional_piece_is_a_field_the_crds_list(piece):
    runtime, trainjob = objects(render_values(with_keys(kind="trainjob", **OPTIONAL_PIECES[piece])))
    assert_strict(runtime, TRAINING_RUNTIME_SCHEMA)
    assert_strict(trainjob, TRAINJOB_SCHEMA)


@pytest.mark.parametrize(
    "key, value",
    [("queue", "research"), ("network_topology", {"mode": "hard"}), ("task_name", "node")],
)
def test_a_key_the_trainjob_cannot_honour_is_refused_naming_key_and_kind(key, value):
    with pytest.raises(SpecError) as error:
        spec_from(with_keys(kind="trainjob", **{key: value}))
    (problem,) = error.value.problems
    assert problem.startswith(key) and "(kind trainjob) cannot honour it" in problem, problem


@pytest.mark.parametrize("name", ["PET_NODE_RANK", "PET_MASTER_ADDR", "PET_NNODES"])
def test_an_env_the_trainer_sets_itself_is_refused(name):
    with pytest.raises(SpecError, match=name):
        spec_from(with_keys(kind="trainjob", env={name: "x"}))


def test_train_sh_unsets_every_pet_variable_the_trainer_injects():
    script = dict(render_values(with_keys(kind="trainjob", nodes=2)).scripts)["train.sh"]
    unset = [line for line in script.splitlines() if line.startswith("unset ")]
    assert len(unset) == 1 and set(TRAINJOB.launcher_env) <= set(unset[0].split()[1:])


def test_a_name_the_trainjobs_jobset_could_not_take_is_refused():
    # 'a' * 49: the JobSet's pod names a...-node-0-7-<5 random characters> are 64 characters
    with pytest.raises(SpecError) as error:
        spec_from(with_keys(name="a" * 49, nodes=8), "kind=trainjob")
    (problem,) = error.value.problems
    assert f"'{'a' * 49}-node-0-7-abcde' has 64 characters" in problem, problem
    assert "'<name>-node-0-<index>-<5 random characters>'" in problem
    spec_from(with_keys(name="a" * 48, nodes=8), "kind=trainjob")
    with pytest.raises(SpecError, match="a Service's name must start with a letter"):
        spec_from(with_keys(name="7b-train"), "kind=trainjob")


def test_restart_job_reaches_the_runtimes_job_and_pod_the_default_leaves_it_alone():
    def job_spec(*sets):
        runtime, _ = objects(render_values(with_keys(kind="trainjob", nodes=3), *sets))
        (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        return rjob["template"]["spec"]

    assert "backoffLimit" not in job_spec()
    assert job_spec("restart=job")["backoffLimit"] == 0
