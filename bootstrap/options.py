"""The bootstrap's options, each declared once in :data:`OPTIONS` (pure).

An :class:`Option` gives a setting's flag, the environment variable read when the flag is not
given, how a value is read (:data:`READERS`), its meaning and what applies when neither is given.
That table drives

* the command line (:func:`~npu_job.bootstrap.command.configure`: groups, metavars, choices, and
  a help line that names the variable and the default);
* the environment fallbacks (:func:`resolve`: flag, else variable, else default, into
  :class:`BootstrapOptions`; a bad value is an :class:`~npu_job.errors.InputError` naming the flag
  or the variable);
* the help's list of variables (:func:`environment_names`) and the option table of
  docs/bootstrap.md (:func:`options_markdown`; a test keeps the page equal to it);
* ``npu-job plan``'s flags for the settings it shares with a pod (a row's :class:`PlanFlag`: the
  same flag, told as plan reads it, from files alone).

A few rows are read where they are used, not by :func:`resolve`: the service account's folder
(with the API's address), and the interpreter ``bootstrap.sh`` starts.

The job's kind (``--kind``, ``$NPU_JOB_KIND``, a record of :mod:`npu_job.kinds`) is read first:
a row may read the variable of the kind (:attr:`Option.kind_env`), such as this pod's index,
which each kind's controller sets under its own name.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Mapping, NamedTuple, Optional, Tuple

from npu_job.kinds import DEFAULT, KIND_ENV, KINDS, kind_named
from npu_job.kinds.base import JobKind

from npu_job.errors import InputError, shown
from npu_job.parsing import count_from_text, is_false, is_true, seconds_from_text
from npu_job.podfacts import (
    DEFAULT_RANK_TABLES,
    FULL_NODE_ENV,
    OUTPUT_DIR,
    OUTPUT_DIR_ENV,
    PYTHON_ENV,
    RANK_TABLE_ENV,
    STRICT_ENV,
)

from .base.model import TOPOLOGY_FORMATS, Collective

PODS_ENV = "NPU_JOB_PODS"
TOPOLOGY_ENV = "NPU_JOB_TOPOLOGY"
TOR_INFO_ENV = "NPU_JOB_TOR_INFO"
K8S_TOPOLOGY_ENV = "NPU_JOB_K8S_TOPOLOGY"
JOB_SIZE_ENV = "MA_NUM_HOSTS"
SERVICE_ACCOUNT_ENV = "NPU_JOB_K8S_SA_DIR"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOPOLOGY_LABELS_ENV = "NPU_JOB_TOPOLOGY_LABELS"
HCCL_ALGO_ENV = "HCCL_ALGO"

WAIT_TIMEOUT = 300.0
POLL_INTERVAL = 5.0
COLLECTIVES = tuple(collective.value for collective in Collective)

INPUTS, THIS_POD, PLANNING = "inputs", "this pod", "planning and output"


class PlanFlag(NamedTuple):
    """How ``npu-job plan`` tells a setting it takes too: it reads the inputs from the files named
    on its command line, never from a pod's environment or the cluster, so its help says that."""

    help: str
    metavar: Optional[str] = None  # None: the option's own


class Option(NamedTuple):
    """One setting of the bootstrap."""

    name: str  # the BootstrapOptions field and the flag's dest ("" where resolve does not read it)
    flag: Optional[
        str
    ]  # "--rank-table" (also taken as --rank_table, as torchrun does); None: env only
    env: Optional[str]  # read when the flag is not given; None: the flag only
    kind: str  # how a value is read: a key of READERS, or "" where it is read at its use
    group: str
    meaning: str
    default: str  # what applies when neither is given, as help and docs tell it ("": nothing)
    metavar: Optional[str] = None
    choices: Tuple[str, ...] = ()
    plan: Optional[PlanFlag] = None  # npu-job plan takes the flag too, told as this
    # a JobKind attribute naming the variable read on a pod of that kind (such as index_env);
    # env is then the default kind's, as help and docs name it
    kind_env: str = ""

    @property
    def is_switch(self) -> bool:
        """A switch: a flag without a value (its variable turns it on, or off)."""
        return self.kind in ("on", "unless off")


OPTIONS: Tuple[Option, ...] = (
    Option(
        "rank_table", "--rank-table", RANK_TABLE_ENV, "text", INPUTS,
        "rank table file, directory holding jobstart_hccl.json (or hccl.json), or http(s) URL",
        ", then ".join(DEFAULT_RANK_TABLES), "PATH|URL",
        plan=PlanFlag(
            "rank table: a file, a directory holding jobstart_hccl.json, or an http(s) URL (any"
            " format the bootstrap reads; plain JSON or base64+gzip)",
        ),
    ),
    Option(
        "pods", "--pods", PODS_ENV, "text", INPUTS,
        "no rank table: the job's pods are the servers, listed from the in-cluster API ('k8s') or"
        " read from kubectl get pods -o json; waits until every pod is scheduled (a rank table"
        " named by --rank-table or $RANK_TABLE_FILE wins)",
        "", "k8s|PATH|URL",
        plan=PlanFlag(
            "instead of a rank table, a job's pods: kubectl get pods -o json (or -o yaml),"
            " or one kubectl get hypernodes,nodes,pods -o json whose HyperNodes or node labels are"
            " then the topology",
            "PATH|URL",
        ),
    ),
    Option(
        "kind", "--kind", KIND_ENV, "job kind", INPUTS,
        "the job's kind, as npu-job render's spec key kind names it: which labels mark the job's"
        " pods and their indices, and which variable holds this pod's index",
        DEFAULT, "KIND",
        plan=PlanFlag(
            "with --pods: the job's kind, whose labels mark the job's pods and their indices"
            f" (default: {DEFAULT})",
        ),
    ),
    Option(
        "job", "--job", "MA_VJ_NAME", "text", INPUTS,
        "with --pods: the job's name (Volcano's job), its kind's job label", "", "NAME",
        plan=PlanFlag(
            "with --pods: the job's name (Volcano's job), its kind's job label (default: the"
            " one job the pods belong to)",
        ),
    ),
    Option(
        "task", "--task", "MA_TASK_NAME", "text", INPUTS,
        "with --pods: the job's group of training pods (Volcano's task), its kind's group label",
        "", "NAME",
        plan=PlanFlag(
            "with --pods: only this group's pods (Volcano's task), its kind's group label",
        ),
    ),
    Option(
        "namespace", "--namespace", "NPU_JOB_NAMESPACE", "text", INPUTS,
        "with --pods k8s: the job's namespace", "the service account's", "NAME",
        plan=PlanFlag("with --pods: only this namespace"),
    ),
    Option(
        "nnodes", "--nnodes", JOB_SIZE_ENV, "count", INPUTS,
        "how many nodes (pods) the job has: a rank table listing another number of servers is"
        " refused alike on every pod; with --pods, how many pods to wait for",
        "unchecked; with --pods, up to the highest pod index", "N",
        plan=PlanFlag(
            "how many nodes the job has: a rank table listing another number of servers is"
            " refused, as every pod of the job refuses it (default: unchecked)"
        ),
    ),
    Option(
        "topology", "--topology", TOPOLOGY_ENV, "text", INPUTS,
        "switch topology: a file, a URL, or 'k8s' for the cluster's HyperNodes, else its node"
        " labels, from the Kubernetes API; when named, it must work",
        "the first found of ranktable_tor.json beside the rank table, $NPU_JOB_TOR_INFO, the"
        " Kubernetes API, /etc/npu-job/topology.yaml",
        "PATH|URL|k8s",
        plan=PlanFlag(
            "switch topology file or URL (ranktable_tor.json, basic-tor-node-cm tor_info, a"
            " Kubernetes NodeList or HyperNodeList, or a plain YAML/JSON topology; default: as a"
            " pod finds it, without the environment and the cluster: the HyperNodes or Nodes in"
            " the --pods file, else ranktable_tor.json beside the rank table, else"
            " /etc/npu-job/topology.yaml)",
            "PATH|URL",
        ),
    ),
    Option(
        "topology_format", "--topology-format", "NPU_JOB_TOPOLOGY_FORMAT", "text", INPUTS,
        "read the topology as this format", "detect by content", None, TOPOLOGY_FORMATS,
        plan=PlanFlag("read --topology as this format (default: detect by content)"),
    ),
    Option(
        "topology_labels", "--topology-labels", TOPOLOGY_LABELS_ENV, "labels", INPUTS,
        "read the switch path from these node labels, outermost first, instead of the known"
        " Volcano, CCE, EKS, GKE and topograph labels",
        "", "KEY,KEY,...",
        plan=PlanFlag(
            "read switch paths from these node labels, outermost first, instead of the known"
            " Volcano, CCE, EKS, GKE and topograph labels",
        ),
    ),
    Option(
        "nodes", "--nodes", "NPU_JOB_NODES", "text", INPUTS,
        "the cluster's Nodes (kubectl get nodes -o json) for a HyperNode topology file: their"
        " labels serve labelMatch members, their InternalIPs key the result",
        "", "PATH|URL",
        plan=PlanFlag(
            "the cluster's Nodes (kubectl get nodes -o json) beside a HyperNode topology: their"
            " labels serve labelMatch members, their InternalIPs match rank-table server ids",
        ),
    ),
    Option(
        "tor_info", None, TOR_INFO_ENV, "text", INPUTS,
        "a mounted MindCluster tor_info (or the whole ConfigMap), in the topology chain", "",
    ),
    Option(
        "k8s_topology", None, K8S_TOPOLOGY_ENV, "unless off", INPUTS,
        "0: the topology chain does not ask the Kubernetes API", "1",
    ),
    Option(
        "", None, SERVICE_ACCOUNT_ENV, "", INPUTS,
        "the service account's token and ca.crt (the API's address: KUBERNETES_SERVICE_HOST and"
        " _PORT)",
        SERVICE_ACCOUNT_DIR,
    ),
    Option(
        "ca_bundle", "--ca-bundle", "NPU_JOB_CA_BUNDLE", "text", INPUTS,
        "CA certificates for https:// inputs", "the system's (REQUESTS_CA_BUNDLE honoured)", "FILE",
    ),
    Option(
        "host_ip", "--host-ip", "MA_CURRENT_HOST_IP", "text", THIS_POD,
        "this host's IP, matched to a server_id", "", "IP",
    ),
    Option(
        "pod_index", "--pod-index", KINDS[DEFAULT].index_env, "text", THIS_POD,
        "this pod's scheduler index, a cross-check", "", "N", kind_env="index_env",
    ),
    Option(
        "collective", "--collective", HCCL_ALGO_ENV, "collective", PLANNING,
        "collective to optimise the order for; the variable counts for what HCCL's algorithm"
        " implies",
        "ring", None, COLLECTIVES,
        plan=PlanFlag("collective to optimise and score for (default: from $HCCL_ALGO, else ring)"),
    ),
    Option(
        "full_node_devices", "--full-node-devices", FULL_NODE_ENV, "count", PLANNING,
        "devices of a full node: a rank table with any server holding another count is not"
        " reordered (partial nodes; platform rule); render sets it from full_node_npus",
        "only equal counts on every server are required", "N",
    ),
    Option(
        "output_dir", "--output-dir", OUTPUT_DIR_ENV, "text", PLANNING,
        "where to write the files", OUTPUT_DIR, "DIR",
    ),
    Option(
        "wait_timeout", "--wait-timeout", "NPU_JOB_WAIT_TIMEOUT", "seconds", PLANNING,
        "give up waiting for status 'completed' (or for every pod) after this long",
        f"{WAIT_TIMEOUT:g}", "SECONDS",
    ),
    Option(
        "poll_interval", "--poll-interval", "NPU_JOB_POLL_INTERVAL", "seconds", PLANNING,
        "seconds between polls of the rank table (or the pods)", f"{POLL_INTERVAL:g}", "SECONDS",
    ),
    Option(
        "strict", "--strict", STRICT_ENV, "on", PLANNING,
        "exit with the error's code instead of falling back to scheduler order", "off",
    ),
    Option("json", "--json", None, "on", PLANNING, "print route_plan.json on stdout", "off"),
    Option(
        "", None, PYTHON_ENV, "", PLANNING,
        "the interpreter bootstrap.sh runs the bootstrap on", "python3",
    ),
)  # fmt: skip


class BootstrapOptions(NamedTuple):
    """Every setting :func:`resolve` reads, one field per named row of :data:`OPTIONS` (a test
    keeps the two equal)."""

    rank_table: Optional[str] = None  # path, directory or URL; None: the default locations
    pods: Optional[str] = None  # no rank table: "k8s" (the API) or a kubectl get pods -o json
    kind: JobKind = KINDS[DEFAULT]  # the job's kind (its record)
    job: Optional[str] = None
    task: Optional[str] = None
    namespace: Optional[str] = None  # None: the service account's
    nnodes: Optional[int] = None  # the job's node count; None: unknown
    topology: Optional[str] = None  # path, URL or "k8s"; None: the chain
    topology_format: Optional[str] = None  # None: detect by content
    topology_labels: Optional[Tuple[str, ...]] = None  # node label keys, outermost first
    nodes: Optional[str] = None  # kubectl get nodes -o json (path or URL) for a HyperNode file
    tor_info: Optional[str] = None
    k8s_topology: bool = True
    ca_bundle: Optional[str] = None  # None: the system's
    host_ip: Optional[str] = None
    pod_index: Optional[str] = None  # as text: identity checks it
    collective: Optional[str] = None  # ring / nhr / rhd; None: ring
    full_node_devices: Optional[int] = None  # None: only equal counts
    output_dir: str = OUTPUT_DIR
    wait_timeout: float = WAIT_TIMEOUT
    poll_interval: float = POLL_INTERVAL
    strict: bool = False
    json: bool = False


def _text(text: str, where: str) -> Optional[str]:
    return text


def _seconds(text: str, where: str) -> float:
    number = seconds_from_text(text.strip(), zero_ok=True)
    if number is None:
        raise InputError(
            "environment", where, f"expected a number of seconds >= 0, got {shown(text)}"
        )
    return number


def _count(text: str, where: str) -> int:
    number = count_from_text(text.strip())
    if number is None or number < 1:
        raise InputError("environment", where, f"expected a whole number >= 1, got {shown(text)}")
    return number


def _on(text: str, where: str) -> bool:
    return is_true(text)


def _unless_off(text: str, where: str) -> bool:
    return not is_false(text)


def _job_kind(text: str, name: str) -> JobKind:
    """The kind ``text`` names; ``name`` (a flag or variable) for the error, which lists the
    known kinds."""
    return kind_named(text.strip(), "environment" if name.isupper() else "command line", name)


def label_keys_from_text(text: str, name: str) -> Tuple[str, ...]:
    """``"k1,k2,k3"`` (outermost first) as keys; ``name`` (a flag or variable) for the error."""
    keys = tuple(part.strip() for part in text.split(","))
    if not keys or any(not key or any(c.isspace() for c in key) for key in keys):
        raise InputError(
            "environment" if name.isupper() else "command line",
            name,
            "expected label keys separated by commas, outermost first "
            f"(e.g. example.com/spine,example.com/rack), got {shown(text)}",
        )
    return keys


# HCCL_ALGO level1 (inter-server) algorithm -> the collective whose traffic pattern it follows.
# NB (nonuniform Bruck) exchanges at distances 2^s like NHR. pipeline runs a ring between servers
# (one per NPU rail) while using intra-server links concurrently. pairwise (all-to-all only) and
# AHC (hierarchy-aware by itself) have no order preference: None, so the caller's default applies.
_HCCL_LEVEL1: Dict[str, Collective] = {
    "ring": Collective.RING,
    "pipeline": Collective.RING,
    "h-d_r": Collective.RHD,
    "hd_r": Collective.RHD,
    "rhd": Collective.RHD,
    "nhr": Collective.NHR,
    "nhr_v1": Collective.NHR,
    "nb": Collective.NHR,
}
# With per-operator HCCL_ALGO ("allreduce=level0:NA;level1:ring/allgather=..."), the operator that
# dominates training traffic decides.
_OPERATOR_PREFERENCE = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce")


def collective_from_hccl_algo(value: Optional[str]) -> Optional[Collective]:
    """Map HCCL's ``HCCL_ALGO`` environment value to a :class:`Collective`, or None.

    Accepts the global form ``level0:NA;level1:H-D_R``, the per-operator form
    ``allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:NHR`` (allreduce's choice wins,
    then reducescatter, allgather, ...) and a bare algorithm name. Returns None when ``value`` is
    unset, empty, names no inter-server (level1) algorithm, or one without an order preference.
    """
    if not value or not value.strip():
        return None
    per_operator: Dict[str, str] = {}
    for chunk in value.split("/"):
        operator, sep, levels = chunk.partition("=")
        if sep:
            per_operator[operator.strip().lower()] = levels
        else:
            per_operator.setdefault("", chunk)
    chosen = next((per_operator[op] for op in _OPERATOR_PREFERENCE if op in per_operator), None)
    if chosen is None:
        chosen = per_operator.get("", next(iter(per_operator.values()), ""))
    algorithm: Optional[str] = None
    for level in chosen.split(";"):
        name, sep, algo = level.partition(":")
        if sep and name.strip().lower() == "level1":
            algorithm = algo
        elif not sep and ";" not in chosen:
            algorithm = name  # a bare algorithm name
    if algorithm is None:
        return None
    return _HCCL_LEVEL1.get(algorithm.strip().lower())


def _collective(text: str, where: str) -> Optional[str]:
    implied = collective_from_hccl_algo(text)
    return None if implied is None else implied.value


#: how a variable's text is read, by kind (the variable's name goes into a bad value's message);
#: a flag's value arrives already read by argparse (its type and choices come from the same row)
READERS: Dict[str, Callable[[str, str], Any]] = {
    "text": _text,
    "seconds": _seconds,
    "count": _count,
    "on": _on,  # a switch, off unless the variable says 1, true, yes or on
    "unless off": _unless_off,  # a switch, on unless the variable says 0, false, no or off
    "labels": label_keys_from_text,
    "collective": _collective,
    "job kind": _job_kind,
}
# readers a flag's value goes through too (argparse takes it as text)
_FLAG_READERS = ("labels", "job kind")


def _given(option: Option, flags: Mapping[str, Any], env: Mapping[str, str], kind: JobKind) -> Any:
    """The option's value from its flag, else its variable on a pod of ``kind``; None where
    neither says anything."""
    value = flags.get(option.name)
    if value is not None and value is not False:
        if option.kind in _FLAG_READERS:
            return READERS[option.kind](str(value), option.flag or option.name)
        return value
    name = env_name(option, kind)
    text = env.get(name, "") if name else ""
    if not text.strip():
        return None
    return READERS[option.kind](text, name or "")


def env_name(option: Option, kind: JobKind) -> Optional[str]:
    """The variable ``option`` reads on a pod of ``kind``: the kind's own where the row says so
    (:attr:`Option.kind_env`)."""
    return getattr(kind, option.kind_env) if option.kind_env else option.env


def _kind(flags: Mapping[str, Any], env: Mapping[str, str]) -> JobKind:
    """The job's kind: ``--kind``, else ``$NPU_JOB_KIND``, else the default."""
    default = KINDS[DEFAULT]
    return _given(option_named("kind"), flags, env, default) or default


def resolve(flags: Mapping[str, Any], env: Mapping[str, str]) -> BootstrapOptions:
    """Options from parsed flags (None or false = not given) over the environment, over the
    defaults; a bad value raises :class:`~npu_job.errors.InputError`. The kind is read first:
    the rows of :attr:`Option.kind_env` read its variables."""
    kind = _kind(flags, env)
    values: Dict[str, Any] = {"kind": kind}
    for option in OPTIONS:
        if option.name and option.name != "kind":
            value = _given(option, flags, env, kind)
            if value is not None:
                values[option.name] = value
    return BootstrapOptions(**values)


def resolve_one(name: str, flags: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    """One option as :func:`resolve` reads it (the run's fallback reads ``strict`` and
    ``output_dir`` this way, so that another option's bad value cannot stop it)."""
    option = option_named(name)
    kind = _kind(flags, env) if option.kind_env else KINDS[DEFAULT]
    value = _given(option, flags, env, kind)
    return getattr(BootstrapOptions(), name) if value is None else value


def option_named(name: str) -> Option:
    """The row of the setting ``name`` (a :class:`BootstrapOptions` field)."""
    (option,) = [option for option in OPTIONS if option.name == name]
    return option


def underscore_alias(flag: str) -> Optional[str]:
    """``--rank_table`` for ``--rank-table`` (torchrun takes both spellings); None for one word."""
    alias = "--" + flag[2:].replace("-", "_")
    return alias if alias != flag else None


def help_text(option: Option) -> str:
    """The flag's help line: its meaning, then where its default comes from."""
    if option.is_switch:
        return f"{option.meaning} (also {option.env}=1)" if option.env else option.meaning
    sources = [f"${option.env}" + (_OR_THE_KINDS if option.kind_env else "")] if option.env else []
    if option.default:
        sources.append(("else " if sources else "") + option.default)
    return f"{option.meaning} (default: {', '.join(sources)})" if sources else option.meaning


# how help and docs tell a row of the kind's variable (Option.kind_env) by the default kind's name
_OR_THE_KINDS = " or the job kind's own"


def environment_names() -> Iterator[str]:
    """Every variable the bootstrap reads, in table order."""
    for option in OPTIONS:
        if option.env:
            yield option.env


def options_markdown() -> str:
    """The option table of docs/bootstrap.md."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for option in OPTIONS:
        flag = "—"
        if option.flag:
            value = "|".join(option.choices) if option.choices else option.metavar
            flag = f"`{option.flag} {value}`" if value else f"`{option.flag}`"
        switch = option.kind == "on"  # off unless the variable says so
        env = f"`{option.env}=1`" if switch and option.env else "—"
        if option.env and not switch:
            env = f"`{option.env}`" + (_OR_THE_KINDS if option.kind_env else "")
        default = option.default or "unset"
        if not switch and (option.default.startswith("/") or option.default.isalnum()):
            # paths and values as typed
            default = ", then ".join(f"`{part}`" for part in option.default.split(", then "))
        cells = (flag, env, default, option.meaning)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    rows.append("| `-v` / `-q` | — | info | more or less log output on stderr |")
    return "\n".join(rows) + "\n"
