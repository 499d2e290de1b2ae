"""A rendered Volcano Job becomes the pods a cluster would start (pure: the demo's pod simulator).

:func:`pod_specs`: rendered manifest documents in, one :class:`PodSpec` per pod out. It does what
the Volcano controller, its job plugins and the kubelet would do before the container's first
instruction runs, and nothing more:

* pods ``<job>-<task>-<i>`` for every task replica, in task order;
* the ``env`` plugin's ``VC_TASK_INDEX`` / ``VK_TASK_INDEX``;
* the ``svc`` plugin's hostname ``<job>-<task>-<i>`` under subdomain ``<job>`` (so
  ``<job>-<task>-<i>.<job>`` resolves to the pod), ``VC_<TASK>_HOSTS`` / ``VC_<TASK>_NUM`` and its
  ``/etc/volcano`` files;
* ``valueFrom.fieldRef`` resolved as the kubelet does (``status.hostIP`` and ``status.podIP`` ->
  the pod's host address, ``metadata.name``/``namespace``, ``spec.nodeName``,
  ``metadata.annotations['volcano.sh/job-name']`` / ``['volcano.sh/task-spec']`` and labels);
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

from npu_job.kinds.volcano import TASK_INDEX_ENV

from npu_job.errors import InputError
from npu_job.podfacts import (
    RANK_ENV,
    RANK_TABLE_ENV,
    RANK_TABLE_NAME,
    RANKTABLE_TOR_NAME,
)

JOB_API_VERSION = "batch.volcano.sh/v1alpha1"
SVC_MOUNT_PATH = "/etc/volcano"
SETUP_FAILED = "podsim: cannot set up the pod:"  # the line a pod prints when its namespaces fail
DEFAULT_CONFIGMAP_MODE = 0o644
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # an image's usual PATH

# Variables a Volcano pod never inherits from the machine that runs the demo: a pod starts from
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
    task: str
    index: int  # VC_TASK_INDEX
    name: str  # <job>-<task>-<i>, also the hostname
    subdomain: str  # the job name (svc plugin)
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

    @property
    def dns_name(self) -> str:
        return f"{self.name}.{self.subdomain}"

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


def svc_env_name(task: str, suffix: str) -> str:
    """``VC_<TASK>_HOSTS`` / ``VC_<TASK>_NUM``: the task name upper-cased, ``-`` -> ``_``."""
    return f"VC_{task.upper().replace('-', '_')}_{suffix}"


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


def find_job(documents: Sequence[Any], source: str = "manifest") -> Tuple[int, Dict[str, Any]]:
    """The (document index, document) of the Volcano Job in a rendered stream."""
    jobs = [
        (index, doc)
        for index, doc in enumerate(documents)
        if isinstance(doc, dict)
        and doc.get("kind") == "Job"
        and str(doc.get("apiVersion", "")).startswith("batch.volcano.sh/")
    ]
    if len(jobs) != 1:
        raise InputError(
            source,
            "kind",
            f"expected exactly one Volcano Job ({JOB_API_VERSION}), found {len(jobs)}",
        )
    return jobs[0]


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
    """One :class:`PodSpec` per pod of the Volcano Job in ``documents`` (pure).

    ``host_ips[k]`` is the host address of the k-th pod (tasks in order, replicas by index);
    ``image_env`` is the environment the image provides (the container env is layered on top),
    ``image_paths`` the host directories its software lives in;
    ``cluster_files`` maps absolute paths to the text that cluster plugins mount into every pod
    (or the kubelet: a service account's token); ``cluster_env`` is what the kubelet adds to every
    container's environment (``KUBERNETES_SERVICE_HOST/PORT``), before the container's own env.
    """
    _, job = find_job(documents, source)
    metadata = _require(job, "metadata", source, "")
    job_name = str(metadata.get("name", ""))
    namespace = str(metadata.get("namespace") or "default")
    spec = _require(job, "spec", source, "")
    tasks = _require(spec, "tasks", source, "spec", list)
    plugins = spec.get("plugins") or {}
    maps = config_maps(documents)
    replicas_of = [int(task.get("replicas", 1)) for task in tasks]
    if len(host_ips) != sum(replicas_of):
        raise InputError(
            source,
            "spec.tasks[*].replicas",
            f"{len(host_ips)} pods (one per host address), found {sum(replicas_of)}",
        )

    pod_names = [
        [f"{job_name}-{task.get('name')}-{index}" for index in range(count)]
        for task, count in zip(tasks, replicas_of)
    ]
    svc_env: Dict[str, str] = {}
    svc_files: List[Tuple[str, str]] = []
    hosts: List[Tuple[str, Tuple[str, ...]]] = [("127.0.0.1", ("localhost",))]
    if "svc" in plugins:
        flat = 0
        for task, names in zip(tasks, pod_names):
            fqdns = [f"{name}.{job_name}" for name in names]
            task_key = str(task.get("name")).replace("-", "_")
            svc_env[svc_env_name(str(task.get("name")), "HOSTS")] = ",".join(fqdns)
            svc_env[svc_env_name(str(task.get("name")), "NUM")] = str(len(names))
            svc_files += [
                (f"{task_key}.host", "\n".join(fqdns)),
                (svc_env_name(str(task.get("name")), "HOSTS"), ",".join(fqdns)),
                (svc_env_name(str(task.get("name")), "NUM"), str(len(names))),
            ]
            for fqdn in fqdns:
                hosts.append((host_ips[flat], (fqdn,)))
                flat += 1

    specs: List[PodSpec] = []
    flat = 0
    for task_position, (task, names) in enumerate(zip(tasks, pod_names)):
        where_task = f"spec.tasks[{task_position}]"
        template = _require(task, "template", source, where_task)
        template_meta = template.get("metadata") or {}
        pod_spec = _require(template, "spec", source, f"{where_task}.template")
        containers = _require(pod_spec, "containers", source, f"{where_task}.template.spec", list)
        if len(containers) != 1:
            raise InputError(
                source,
                f"{where_task}.template.spec.containers",
                f"exactly one container (podsim runs one process per pod), found {len(containers)}",
            )
        container = containers[0]
        where = f"{where_task}.template.spec.containers[0]"
        volumes = {str(v.get("name")): v for v in pod_spec.get("volumes") or []}
        file_mounts, host_mounts = _volume_mounts(
            container, volumes, maps, source=source, where=where
        )
        if svc_files:
            file_mounts.append(FileMount(SVC_MOUNT_PATH, tuple(sorted(svc_files))))
        for path, text in sorted((cluster_files or {}).items()):
            file_mounts.append(
                FileMount(path, ((Path(path).name, text),), DEFAULT_CONFIGMAP_MODE, True)
            )
        annotations = {
            **{str(k): str(v) for k, v in (template_meta.get("annotations") or {}).items()},
            "volcano.sh/job-name": job_name,
            "volcano.sh/task-spec": str(task.get("name")),
        }
        labels = {str(k): str(v) for k, v in (template_meta.get("labels") or {}).items()}
        for index, name in enumerate(names):
            host_ip = host_ips[flat]
            annotations_i = {**annotations, "volcano.sh/task-index": str(index)}
            own_names = (f"{name}.{job_name}", name) if "svc" in plugins else (name,)
            pod = {
                "name": name,
                "namespace": namespace,
                "host_ip": host_ip,
                "node_name": f"node-{host_ip}",
            }
            env: Dict[str, str] = dict(image_env or {})
            env.update(cluster_env or {})
            env["HOSTNAME"] = name
            if "env" in plugins:
                env["VK_TASK_INDEX"] = env[TASK_INDEX_ENV] = str(index)
            env.update(svc_env)
            for position, variable in enumerate(container.get("env") or []):
                at = f"{where}.env[{position}]"
                key = str(variable.get("name"))
                if "valueFrom" in variable:
                    ref = (variable.get("valueFrom") or {}).get("fieldRef")
                    if not isinstance(ref, dict):
                        raise InputError(
                            source,
                            f"{at}.valueFrom",
                            "a fieldRef (podsim resolves no other source)",
                        )
                    env[key] = _field_ref(
                        str(ref.get("fieldPath")),
                        pod=pod,
                        annotations=annotations_i,
                        labels=labels,
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
                raise InputError(
                    source, f"{where}.command", "a command (podsim has no image entrypoint)"
                )
            specs.append(
                PodSpec(
                    job=job_name,
                    namespace=namespace,
                    task=str(task.get("name")),
                    index=index,
                    name=name,
                    subdomain=job_name if "svc" in plugins else "",
                    host_ip=host_ip,
                    argv=tuple(argv),
                    env=tuple(env.items()),
                    working_dir=str(container.get("workingDir") or "/"),
                    hosts=tuple(hosts) + ((host_ip, own_names),),
                    file_mounts=tuple(file_mounts),
                    host_mounts=tuple(host_mounts),
                    restart_policy=str(pod_spec.get("restartPolicy") or "Always"),
                    image_paths=tuple(image_paths),
                )
            )
            flat += 1
    return tuple(specs)


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
