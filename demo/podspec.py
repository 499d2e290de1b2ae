"""A rendered job object becomes the pods a cluster would start (pure: the demo's pod simulator).

:func:`pod_specs`: rendered manifest documents in, one :class:`PodSpec` per pod out. It does what
the job kind's controller and the kubelet would do before the container's first instruction runs,
and nothing more. The controller's part is the kind's record's
(:meth:`npu_job.kinds.base.JobKind.controller_pods`, the kind found by the job object's apiVersion
and kind): the pods' names, hostnames and subdomains, their labels and annotations, the variables
and files the controller injects, and the names that resolve to each pod (for the Volcano Job:
pods ``<job>-<task>-<i>``, the ``env`` plugin's ``VC_TASK_INDEX``, the ``svc`` plugin's
``<job>-<task>-<i>.<job>`` and ``/etc/volcano``). The kubelet's part is here, the same for every
kind:

* an ``/etc/hosts`` of every pod's cluster names and, on the pod's own line, its hostname;
* ``valueFrom.fieldRef`` resolved as the kubelet does (``status.hostIP`` and ``status.podIP`` ->
  the pod's host address, ``metadata.name``/``namespace``, ``spec.nodeName``, the pod's
  ``metadata.annotations['...']`` and ``metadata.labels['...']``);
* Kubernetes' ``$(VAR)`` expansion of env values, ``command`` and ``args`` (``$$`` -> ``$``,
  unknown references kept verbatim), so the container gets exactly what the kubelet would pass;
* ConfigMap volumes (``items``, ``subPath``, ``defaultMode``) as files to place at their mount
  paths, ``hostPath`` volumes as bind mounts, ``emptyDir`` as a fresh directory;
* files that cluster plugins deliver (``cluster_files``: e.g. CCE's ``configmap1980`` rank table
  at ``/user/config/jobstart_hccl.json``), passed in by the caller, who gives them only to a job
  that has the plugin (CCE serves NPU jobs; a CPU or GPU job mounts its rank table from its own
  volumes, e.g. a ConfigMap in the stream, which this module mounts like any other), and the
  service account and ``KUBERNETES_SERVICE_*`` variables the kubelet gives every pod
  (``cluster_env``), for a job that routes by the Kubernetes API.

``podsim`` starts a :class:`PodSpec` as an isolated process (namespaces, mounts, chroot).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from npu_job.kinds import KINDS
from npu_job.kinds.base import ControllerPod, JobKind

from npu_job.errors import InputError
from npu_job.podfacts import RANK_ENV, RANK_TABLE_ENV, RANK_TABLE_NAME, RANKTABLE_TOR_NAME

SETUP_FAILED = "podsim: cannot set up the pod:"  # the line a pod prints when its namespaces fail
DEFAULT_CONFIGMAP_MODE = 0o644
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # an image's usual PATH

# Variables a pod never inherits from the machine that runs the demo: a pod starts from
# its image's environment, and this machine's launcher or bootstrap settings must not leak in.
_LEAKY_PREFIXES = (
    "VC_",
    "VK_",
    "MA_",
    "NPU_JOB_",
    "PET_",
    "TORCHELASTIC_",
    "HCCL_",
    "GLOO_",
    "NCCL_",
)
_LEAKY_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        RANK_TABLE_ENV,
        RANK_ENV,
        "HOSTNAME",
        "PYTEST_CURRENT_TEST",
    }
)


@dataclass(frozen=True)
class FileMount:
    """Files to place at ``mount_path`` (a directory, or one file when ``single_file``)."""

    mount_path: str
    files: Tuple[Tuple[str, str], ...]  # (relative path, text)
    mode: int = DEFAULT_CONFIGMAP_MODE
    single_file: bool = False  # a subPath mount: ``mount_path`` is the file itself
    read_only: bool = True


@dataclass(frozen=True)
class HostMount:
    """A ``hostPath`` volume (or an ``emptyDir`` when ``host_path`` is empty) at ``mount_path``."""

    mount_path: str
    host_path: str  # "" = a fresh empty directory (emptyDir)
    read_only: bool = False
    memory: bool = False  # emptyDir with medium Memory: a tmpfs


@dataclass(frozen=True)
class PodSpec:
    """Everything needed to start one pod's container as a local process."""

    job: str
    namespace: str
    task: str  # the pod's group (its kind's group label: Volcano's task), "" without one
    index: int  # the pod's index in scheduler order (Volcano: VC_TASK_INDEX)
    name: str  # Volcano: <job>-<task>-<i>
    subdomain: str  # "" when the controller sets none (Volcano: the job name, svc plugin)
    host_ip: str
    argv: Tuple[str, ...]  # command + args after $(VAR) expansion
    env: Tuple[Tuple[str, str], ...]  # the container's environment, in definition order
    working_dir: str
    hosts: Tuple[Tuple[str, Tuple[str, ...]], ...]  # /etc/hosts lines: (ip, names)
    file_mounts: Tuple[FileMount, ...] = ()
    host_mounts: Tuple[HostMount, ...] = ()
    restart_policy: str = "Always"
    # host directories of the image's software: the pod sees them at the same paths (podsim binds
    # those its private /tmp would hide)
    image_paths: Tuple[str, ...] = ()
    hostname: str = ""  # "": the pod's name

    def env_dict(self) -> Dict[str, str]:
        return dict(self.env)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PodSpec:
        raw = json.loads(text)
        raw["argv"] = tuple(raw["argv"])
        raw["env"] = tuple(tuple(pair) for pair in raw["env"])
        raw["hosts"] = tuple((ip, tuple(names)) for ip, names in raw["hosts"])
        raw["file_mounts"] = tuple(
            FileMount(**{**m, "files": tuple(tuple(f) for f in m["files"])})
            for m in raw["file_mounts"]
        )
        raw["host_mounts"] = tuple(HostMount(**m) for m in raw["host_mounts"])
        raw["image_paths"] = tuple(raw.get("image_paths", ()))
        return cls(**raw)


def expand_references(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (k8s.io/kubernetes third_party/forked/golang/expansion).

    ``$(NAME)`` becomes the value of a defined variable and stays verbatim otherwise; ``$$`` is an
    escaped ``$``; any other ``$`` is literal.
    """
    out: List[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            following = text[cursor + 1]
            if following == "$":
                out.append("$")
                advance = 1
            elif following == "(":
                closer = text.find(")", cursor + 2)
                if closer == -1:
                    out.append("$(")
                    advance = 1
                else:
                    name = text[cursor + 2 : closer]
                    out.append(variables[name] if name in variables else f"$({name})")
                    advance = closer - cursor
            else:
                out.append("$" + following)
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


def image_environment(
    environ: Mapping[str, str], installation: Optional[Mapping[str, str]] = None
) -> Dict[str, str]:
    """This machine's environment as a container image's ENV: without launch or pod settings.

    ``installation`` (see :func:`.podsim.this_installation`) is the software the image holds: its
    PATH goes first (before ``environ``'s, or a usual image PATH when there is none), its other
    variables are set as they are.
    """
    env = {
        key: value
        for key, value in environ.items()
        if key not in _LEAKY_NAMES and not key.startswith(_LEAKY_PREFIXES)
    }
    installation = installation or {}
    env.update({key: value for key, value in installation.items() if key != "PATH"})
    entries = [
        *installation.get("PATH", "").split(os.pathsep),
        *env.get("PATH", IMAGE_PATH).split(os.pathsep),
    ]
    env["PATH"] = os.pathsep.join(dict.fromkeys(entry for entry in entries if entry))
    return env


def _require(mapping: Any, key: str, source: str, path: str, kind: type = dict) -> Any:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    if not isinstance(value, kind):
        raise InputError(source, f"{path}.{key}" if path else key, f"expected a {kind.__name__}")
    return value


def job_kind_of(document: Any) -> Optional[JobKind]:
    """The registered kind whose apiVersion and kind ``document`` has, or None."""
    if not isinstance(document, dict):
        return None
    key = (document.get("apiVersion"), document.get("kind"))
    return next((kind for kind in KINDS.values() if (kind.api_version, kind.kind) == key), None)


def find_job(
    documents: Sequence[Any], source: str = "manifest", kind: Optional[JobKind] = None
) -> Tuple[int, Dict[str, Any]]:
    """The (document index, document) of the job object in a rendered stream: the one object of
    ``kind``'s apiVersion and kind, or (no ``kind``) of any kind's (:data:`npu_job.kinds.KINDS`)."""
    found = [
        (index, doc)
        for index, doc in enumerate(documents)
        if job_kind_of(doc) is not None and (kind is None or job_kind_of(doc) is kind)
    ]
    if len(found) != 1:
        kinds = (kind,) if kind is not None else tuple(KINDS.values())
        wanted = " or ".join(f"{known.title} ({known.api_version} {known.kind})" for known in kinds)
        raise InputError(source, "kind", f"expected exactly one {wanted}, found {len(found)}")
    return found[0]


def config_maps(documents: Sequence[Any]) -> Dict[str, Dict[str, str]]:
    """ConfigMap name -> {key: text} for every ConfigMap in the stream (binaryData decoded)."""
    import base64

    found: Dict[str, Dict[str, str]] = {}
    for doc in documents:
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            data = {str(k): str(v) for k, v in (doc.get("data") or {}).items()}
            for key, value in (doc.get("binaryData") or {}).items():
                data[str(key)] = base64.b64decode(value).decode("utf-8", "surrogateescape")
            found[str((doc.get("metadata") or {}).get("name"))] = data
    return found


def _field_ref(
    path: str,
    *,
    pod: Dict[str, str],
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    where: str,
    source: str,
) -> str:
    simple = {
        "metadata.name": pod["name"],
        "metadata.namespace": pod["namespace"],
        "status.hostIP": pod["host_ip"],
        "status.podIP": pod["host_ip"],
        "spec.nodeName": pod["node_name"],
        "spec.serviceAccountName": "default",
        "metadata.uid": f"uid-{pod['name']}",
    }
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
    if match:
        table = annotations if match.group(1) == "annotations" else labels
        return table.get(match.group(2), "")
    raise InputError(source, where, f"a fieldRef the kubelet supports, not {path!r}")


def _volume_mounts(
    container: Dict[str, Any],
    volumes: Mapping[str, Dict[str, Any]],
    maps: Mapping[str, Dict[str, str]],
    *,
    source: str,
    where: str,
) -> Tuple[List[FileMount], List[HostMount]]:
    file_mounts: List[FileMount] = []
    host_mounts: List[HostMount] = []
    for position, mount in enumerate(container.get("volumeMounts") or []):
        at = f"{where}.volumeMounts[{position}]"
        name = str(mount.get("name"))
        mount_path = str(mount.get("mountPath", ""))
        if not mount_path.startswith("/"):
            raise InputError(source, f"{at}.mountPath", "an absolute path")
        if name not in volumes:
            raise InputError(source, f"{at}.name", f"a volume of the pod, not {name!r}")
        volume = volumes[name]
        sub_path = str(mount.get("subPath") or "")
        read_only = bool(mount.get("readOnly", False))
        if "configMap" in volume:
            ref = volume["configMap"] or {}
            data = maps.get(str(ref.get("name")))
            if data is None:
                if ref.get("optional"):
                    data = {}
                else:
                    raise InputError(
                        source,
                        f"volumes[{name}].configMap.name",
                        f"a ConfigMap in the stream named {ref.get('name')!r}",
                    )
            mode = int(ref.get("defaultMode", DEFAULT_CONFIGMAP_MODE))
            if ref.get("items"):
                files = []
                for item in ref["items"]:
                    if item.get("key") not in data:
                        raise InputError(
                            source,
                            f"volumes[{name}].configMap.items",
                            f"key {item.get('key')!r} in ConfigMap {ref.get('name')!r}",
                        )
                    files.append((str(item.get("path") or item["key"]), data[item["key"]]))
            else:
                files = sorted(data.items())
            if sub_path:
                chosen = [text for path, text in files if path == sub_path]
                if not chosen:
                    raise InputError(
                        source, f"{at}.subPath", f"a file of ConfigMap {ref.get('name')!r}"
                    )
                file_mounts.append(
                    FileMount(mount_path, ((Path(mount_path).name, chosen[0]),), mode, True)
                )
            else:
                file_mounts.append(FileMount(mount_path, tuple(files), mode, False, True))
        elif "hostPath" in volume:
            host_path = str((volume["hostPath"] or {}).get("path", ""))
            if sub_path:
                host_path = str(Path(host_path) / sub_path)
            host_mounts.append(HostMount(mount_path, host_path, read_only))
        elif "emptyDir" in volume:
            medium = str((volume["emptyDir"] or {}).get("medium") or "")
            host_mounts.append(HostMount(mount_path, "", False, medium == "Memory"))
        else:
            kinds = sorted(set(volume) - {"name"})
            raise InputError(
                source,
                f"volumes[{name}]",
                f"a configMap, hostPath or emptyDir volume (podsim cannot provide {kinds})",
            )
    return file_mounts, host_mounts


def pod_specs(
    documents: Sequence[Any],
    host_ips: Sequence[str],
    *,
    image_env: Optional[Mapping[str, str]] = None,
    cluster_files: Optional[Mapping[str, str]] = None,
    cluster_env: Optional[Mapping[str, str]] = None,
    source: str = "manifest",
    image_paths: Sequence[str] = (),
) -> Tuple[PodSpec, ...]:
    """One :class:`PodSpec` per pod of the job object in ``documents`` (pure), in the order of
    its kind's :meth:`~npu_job.kinds.base.JobKind.stream_pods`.

    ``host_ips[k]`` is the host address of the k-th pod (for the Volcano Job: tasks in order,
    replicas by index);
    ``image_env`` is the environment the image provides (the container env is layered on top),
    ``image_paths`` the host directories its software lives in;
    ``cluster_files`` maps absolute paths to the text that cluster plugins mount into every pod
    (or the kubelet: a service account's token); ``cluster_env`` is what the kubelet adds to every
    container's environment (``KUBERNETES_SERVICE_HOST/PORT``), before the container's own env.
    """
    _, job = find_job(documents, source)
    kind = job_kind_of(job)
    assert kind is not None  # find_job found it by its kind
    metadata = _require(job, "metadata", source, "")
    job_name = str(metadata.get("name", ""))
    namespace = str(metadata.get("namespace") or "default")
    pods = kind.stream_pods(documents, source)  # the job object's, or what the kind reads beside it
    maps = config_maps(documents)
    if len(host_ips) != len(pods):
        raise InputError(
            source,
            kind.replicas_field,
            f"{len(host_ips)} pods (one per host address), found {len(pods)}",
        )
    # what the cluster's DNS resolves, as every pod's /etc/hosts lists it
    hosts: List[Tuple[str, Tuple[str, ...]]] = [("127.0.0.1", ("localhost",))]
    hosts += [(ip, (name,)) for pod, ip in zip(pods, host_ips) for name in pod.dns_names]
    return tuple(
        _pod_spec(
            pod,
            host_ip,
            kind=kind,
            job=job_name,
            namespace=namespace,
            maps=maps,
            hosts=tuple(hosts),
            image_env=image_env or {},
            cluster_files=cluster_files or {},
            cluster_env=cluster_env or {},
            source=source,
            image_paths=tuple(image_paths),
        )
        for pod, host_ip in zip(pods, host_ips)
    )


def _pod_spec(
    pod: ControllerPod,
    host_ip: str,
    *,
    kind: JobKind,
    job: str,
    namespace: str,
    maps: Mapping[str, Dict[str, str]],
    hosts: Tuple[Tuple[str, Tuple[str, ...]], ...],
    image_env: Mapping[str, str],
    cluster_files: Mapping[str, str],
    cluster_env: Mapping[str, str],
    source: str,
    image_paths: Tuple[str, ...],
) -> PodSpec:
    """What the kubelet makes of one of the controller's pods on ``host_ip``."""
    pod_spec = _require(pod.template, "spec", source, pod.where)
    containers = _require(pod_spec, "containers", source, f"{pod.where}.spec", list)
    if len(containers) != 1:
        raise InputError(
            source,
            f"{pod.where}.spec.containers",
            f"exactly one container (podsim runs one process per pod), found {len(containers)}",
        )
    container = containers[0]
    where = f"{pod.where}.spec.containers[0]"
    volumes = {str(v.get("name")): v for v in pod_spec.get("volumes") or []}
    file_mounts, host_mounts = _volume_mounts(container, volumes, maps, source=source, where=where)
    for directory, files in pod.files:
        file_mounts.append(FileMount(directory, files))
    for path, text in sorted(cluster_files.items()):
        file_mounts.append(
            FileMount(path, ((Path(path).name, text),), DEFAULT_CONFIGMAP_MODE, True)
        )
    identity = {
        "name": pod.name,
        "namespace": namespace,
        "host_ip": host_ip,
        "node_name": f"node-{host_ip}",
    }
    env: Dict[str, str] = dict(image_env)
    env.update(cluster_env)
    env["HOSTNAME"] = pod.hostname
    env.update(pod.env)
    for position, variable in enumerate(container.get("env") or []):
        at = f"{where}.env[{position}]"
        key = str(variable.get("name"))
        if "valueFrom" in variable:
            ref = (variable.get("valueFrom") or {}).get("fieldRef")
            if not isinstance(ref, dict):
                raise InputError(
                    source, f"{at}.valueFrom", "a fieldRef (podsim resolves no other source)"
                )
            env[key] = _field_ref(
                str(ref.get("fieldPath")),
                pod=identity,
                annotations=dict(pod.annotations),
                labels=dict(pod.labels),
                where=f"{at}.valueFrom.fieldRef.fieldPath",
                source=source,
            )
        else:
            env[key] = expand_references(str(variable.get("value", "")), env)
    argv = [
        expand_references(str(part), env)
        for part in list(container.get("command") or []) + list(container.get("args") or [])
    ]
    if not argv:
        raise InputError(source, f"{where}.command", "a command (podsim has no image entrypoint)")
    # the kubelet's own line: the pod's cluster names, then its hostname
    own = tuple(dict.fromkeys((*pod.dns_names, pod.hostname)))
    return PodSpec(
        job=job,
        namespace=namespace,
        task=dict(pod.labels).get(kind.group_label, "") if kind.group_label else "",
        index=pod.index,
        name=pod.name,
        subdomain=pod.subdomain,
        host_ip=host_ip,
        argv=tuple(argv),
        env=tuple(env.items()),
        working_dir=str(container.get("workingDir") or "/"),
        hosts=hosts + ((host_ip, own),),
        file_mounts=tuple(file_mounts),
        host_mounts=tuple(host_mounts),
        restart_policy=str(pod_spec.get("restartPolicy") or "Always"),
        image_paths=image_paths,
        hostname=pod.hostname,
    )


def hosts_file_text(spec: PodSpec) -> str:
    """The pod's /etc/hosts."""
    return "".join(f"{ip}\t{' '.join(names)}\n" for ip, names in spec.hosts)


def cce_cluster_files(
    rank_table: Optional[str], ranktable_tor: Optional[str], directory: str = "/user/config"
) -> Dict[str, str]:
    """What CCE's ``configmap1980`` plugin mounts into every pod (docs/bootstrap.md)."""
    files: Dict[str, str] = {}
    if rank_table is not None:
        files[f"{directory}/{RANK_TABLE_NAME}"] = rank_table
    if ranktable_tor is not None:
        files[f"{directory}/{RANKTABLE_TOR_NAME}"] = ranktable_tor
    return files
