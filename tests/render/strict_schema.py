"""Strict schema checks of rendered job objects: a minimal schema, closed where the real CRD is.

The API server prunes (or, with ``kubectl apply --validate=strict``, refuses) every field a
custom resource's schema does not list, so a misspelt or misplaced field of a rendered job object
is silently lost on a real cluster. A kind's test (``tests/render/test_kind_<kind>.py``) writes a
minimal schema of its job object by hand from the kind's CRD, with the fields npu-job renders and
the CRD's own constraints on them, and checks every rendered object against it with
:func:`assert_strict`: unknown fields are errors wherever the real CRD lists properties and does
not preserve unknown fields. Tests never read a CRD file; the schemas are the test's own.

Builders keep those schemas short (:func:`obj`, :func:`array`, :func:`string_map`, ...);
:data:`POD_TEMPLATE` is Kubernetes' ``PodTemplateSpec`` (``core/v1``, which every job CRD embeds
as the same generated schema) with the fields npu-job's shared pod template renders, written from
the Volcano Job CRD's copy. :func:`closed` makes a schema strict the way the API server reads a
structural schema: every object schema that lists ``properties`` gets
``additionalProperties: false`` unless it says ``x-kubernetes-preserve-unknown-fields`` or has
its own ``additionalProperties``; ``nullable`` admits null and ``x-kubernetes-int-or-string`` an
integer or a string. It applies as well to a real CRD's ``openAPIV3Schema`` (checked by hand,
outside the tests).

The validator is the ``jsonschema`` package (JSON Schema 2020-12 semantics for the keywords a CRD
uses).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

Schema = Dict[str, Any]

# --- builders ----------------------------------------------------------------------------------


def string(*, enum: Sequence[str] = (), pattern: str = "", max_length: int = 0) -> Schema:
    schema: Schema = {"type": "string"}
    if enum:
        schema["enum"] = list(enum)
    if pattern:
        schema["pattern"] = pattern
    if max_length:
        schema["maxLength"] = max_length
    return schema


def integer(*, minimum: Optional[int] = None, maximum: Optional[int] = None) -> Schema:
    schema: Schema = {"type": "integer"}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def boolean() -> Schema:
    return {"type": "boolean"}


def int_or_string() -> Schema:
    return {"x-kubernetes-int-or-string": True}


def array(items: Schema, *, min_items: int = 0) -> Schema:
    schema: Schema = {"type": "array", "items": items}
    if min_items:
        schema["minItems"] = min_items
    return schema


def strings() -> Schema:
    return array(string())


def string_map() -> Schema:
    """A map of strings (labels, annotations, a nodeSelector)."""
    return {"type": "object", "additionalProperties": string()}


def open_object() -> Schema:
    """An object whose fields the CRD leaves to another schema (``x-kubernetes-preserve-unknown-
    fields``, or an embedded object it does not describe)."""
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def obj(*, required: Sequence[str] = (), **properties: Schema) -> Schema:
    """An object with exactly these ``properties`` (closed by :func:`closed`)."""
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


# --- Kubernetes' own types, as the CRDs embed them -----------------------------------------------

QUANTITY = int_or_string()
OBJECT_META = obj(name=string(), namespace=string(), labels=string_map(), annotations=string_map())
LABEL_SELECTOR = obj(
    matchExpressions=array(
        obj(required=("key", "operator"), key=string(), operator=string(), values=strings())
    ),
    matchLabels=string_map(),
)
POD_AFFINITY_TERM = obj(
    required=("topologyKey",), labelSelector=LABEL_SELECTOR, topologyKey=string()
)
_POD_AFFINITY = obj(
    requiredDuringSchedulingIgnoredDuringExecution=array(POD_AFFINITY_TERM),
)
ENV_VAR = obj(
    required=("name",),
    name=string(),
    value=string(),
    valueFrom=obj(
        fieldRef=obj(required=("fieldPath",), apiVersion=string(), fieldPath=string()),
    ),
)
VOLUME_MOUNT = obj(
    required=("mountPath", "name"),
    name=string(),
    mountPath=string(),
    readOnly=boolean(),
    subPath=string(),
    subPathExpr=string(),
    mountPropagation=string(),
)
VOLUME = obj(
    required=("name",),
    name=string(),
    configMap=obj(
        name=string(),
        defaultMode=integer(),
        optional=boolean(),
        items=array(obj(required=("key", "path"), key=string(), path=string(), mode=integer())),
    ),
    emptyDir=obj(medium=string(), sizeLimit=QUANTITY),
    hostPath=obj(required=("path",), path=string(), type=string()),
    persistentVolumeClaim=obj(required=("claimName",), claimName=string(), readOnly=boolean()),
)
CONTAINER = obj(
    required=("name",),
    name=string(),
    image=string(),
    imagePullPolicy=string(),
    command=strings(),
    args=strings(),
    workingDir=string(),
    ports=array(
        obj(
            required=("containerPort",),
            name=string(max_length=15),
            containerPort=integer(minimum=1, maximum=65535),
            hostPort=integer(),
            protocol=string(),
        )
    ),
    env=array(ENV_VAR),
    resources=obj(
        limits={"type": "object", "additionalProperties": QUANTITY},
        requests={"type": "object", "additionalProperties": QUANTITY},
    ),
    volumeMounts=array(VOLUME_MOUNT),
)
POD_SPEC = obj(
    required=("containers",),
    affinity=obj(podAffinity=_POD_AFFINITY, podAntiAffinity=_POD_AFFINITY),
    securityContext=obj(
        sysctls=array(obj(required=("name", "value"), name=string(), value=string()))
    ),
    hostNetwork=boolean(),
    dnsPolicy=string(),
    priorityClassName=string(),
    serviceAccountName=string(),
    imagePullSecrets=array(obj(name=string())),
    containers=array(CONTAINER),
    nodeSelector=string_map(),
    restartPolicy=string(),
    volumes=array(VOLUME),
    # what a kind's controller may set itself, or a kind's template for it
    hostname=string(),
    subdomain=string(),
)
#: ``PodTemplateSpec``: the metadata a pod template may carry and its pod spec
POD_TEMPLATE = obj(
    metadata=obj(
        name=string(),
        namespace=string(),
        labels=string_map(),
        annotations=string_map(),
        finalizers=strings(),
    ),
    spec=POD_SPEC,
)


# --- kubeflow/common's types, as the replica-spec CRDs embed them (PyTorchJob, AscendJob) --------


def replica_specs(template: Schema, replica_types: Sequence[str]) -> Schema:
    """``map[ReplicaType]*ReplicaSpec``: ``replicas``, ``restartPolicy`` and a pod ``template``, by
    replica type (the types are the controller's validation, the CRD takes any key)."""
    spec = obj(
        replicas=integer(minimum=0),
        restartPolicy=string(enum=("Always", "OnFailure", "Never", "ExitCode")),
        template=template,
    )
    return {
        "type": "object",
        "additionalProperties": spec,
        "propertyNames": {"enum": list(replica_types)},
    }


#: ``RunPolicy`` with the fields npu-job renders and the PodGroup's ``SchedulingPolicy``
RUN_POLICY = obj(
    backoffLimit=integer(),
    cleanPodPolicy=string(),
    activeDeadlineSeconds=integer(),
    ttlSecondsAfterFinished=integer(),
    schedulingPolicy=obj(
        minAvailable=integer(),
        queue=string(),
        priorityClass=string(),
        minResources={"type": "object", "additionalProperties": QUANTITY},
    ),
)

# --- strictness and validation ----------------------------------------------------------------


def closed(schema: Any) -> Any:
    """``schema`` read as the API server reads a structural schema (see the module docstring):
    unknown fields are errors wherever properties are listed and unknown fields not kept."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: Schema = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "definitions", "$defs"):
            out[key] = {name: closed(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "allOf", "oneOf"):
            out[key] = closed(value)
        else:
            out[key] = value
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    return out


def problems(instance: Any, schema: Schema) -> List[str]:
    """Every way ``instance`` breaks the closed ``schema``, as ``<path>: <message>`` lines."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(closed(schema))
    found = []
    for error in validator.iter_errors(instance):
        path = ".".join(str(part) for part in error.absolute_path) or "(the object)"
        found.append(f"{path}: {error.message}")
    return sorted(found)


def assert_strict(instance: Any, schema: Schema, what: str = "the object") -> None:
    """Fail, listing every problem, unless ``instance`` validates against the closed ``schema``."""
    found = problems(instance, schema)
    assert not found, f"{what} breaks its schema:\n" + "\n".join(found)
