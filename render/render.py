"""``render(spec) -> RenderedJob``: a validated :class:`JobSpec` through the Jinja templates.

Pure apart from reading the package's own templates and the pod side it bundles
(:mod:`npu_job.bundle`): values in, an inspectable object out.
``RenderedJob.stream()`` is the multi-document YAML for ``kubectl apply -f -`` (a ``# Source:``
comment per document; the scripts ConfigMap, the RBAC, any other object the kind's template emits,
such as a headless Service, then the job object that needs them) and ``RenderedJob.files()`` the
files ``--output-dir`` writes; the CLI is just a writer of these.

The job object is the spec's job kind's (:mod:`npu_job.kinds`): its record names the template
that renders it, and every kind's template places the one shared pod template (``pod.yaml.j2``,
rendered first at column 0, put in place with Jinja's ``indent`` filter), so what a pod gets is the
same whatever runs it; the kind's record fills in what its controller demands (container name,
restart policy, the labels and annotations the pod's identity is read from, the index variable,
the master address rule, the launcher variables to unset, extra RBAC rules).

Escaping, the one thing that must never go wrong:

* every YAML value goes through ``tojson`` (:func:`yaml_scalar`: JSON, which is YAML, with the
  characters YAML would not keep verbatim escaped, so that PyYAML and kubectl read every string
  back exactly, line breaks and all);
* the scripts in the ConfigMap go through ``yaml_block`` (a literal block scalar, checked by
  parsing it back; a JSON string where a block cannot hold the text exactly);
* every shell word goes through ``shquote`` (:func:`shlex.quote`);
* env values go through ``kubelet_literal``: kubelet expands ``$(VAR)`` in env values, and
  ``$$`` is its escape for ``$``, so a value reaches the process exactly as written.

Jinja runs with ``StrictUndefined``; a template error becomes a :class:`RenderError` naming the
template and line. Each rendered document is parsed back before it is returned.

``kubectl apply`` (client-side) stores each object it applies as JSON in the object's
``last-applied-configuration`` annotation, and the API server refuses an object whose annotations
total more than 256 KiB: the scripts ConfigMap, which carries the job's bundle, is the one that
can come close. :func:`annotations_after_apply` computes that size as kubectl does, and render
warns (:func:`apply_size_warning`) past :data:`APPLY_WARN_SHARE` of the limit, naming the ways
without it: ``kubectl apply --server-side`` and ``kubectl create``.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import posixpath
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from npu_job.kinds import DEFAULT, KIND_ENV
from npu_job.kinds.base import JobKind

from npu_job import podfacts
from npu_job.bundle import BUNDLE_NAME, Bundle, installed_bundle
from npu_job.errors import BundleError, RenderError

from .keys import NPU_HOST_MOUNTS, SCRIPTS_VOLUME, SHM_VOLUME
from .spec import JobSpec

log = logging.getLogger(__name__)

TEMPLATE_PACKAGE = "npu_job.render.templates"
#: the pod's scripts that are files, not templates (bootstrap.sh, also installed on PATH)
SCRIPTS_PACKAGE = "npu_job.scripts"
SOURCE_PREFIX = "npu-job/templates/"
MANAGED_BY = ("app.kubernetes.io/managed-by", "npu-job")
#: the launcher each `launcher` value runs, as words
LAUNCHER_COMMANDS: Mapping[str, Tuple[str, ...]] = {
    "npu-run": ("npu-run",),
    "torchrun": ("torchrun",),
    "torch.distributed.launch": ("python3", "-m", "torch.distributed.launch"),
}
#: the variables train.sh sets and exports itself: a kind's launcher variables among them are
#: overwritten there, not unset
TRAIN_SH_SETS = frozenset({"NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NNODES", "NPUS_PER_NODE"})


#: The annotation in which ``kubectl apply`` (client-side) keeps the object it applied.
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
#: The API server's limit on the total size of an object's annotations, keys and values, in bytes
#: (Kubernetes' ``TotalAnnotationSizeLimitB``).
ANNOTATIONS_LIMIT = 256 * 1024
#: Render warns when an object's annotations after ``kubectl apply`` pass this share of the limit.
APPLY_WARN_SHARE = 0.9


@dataclass(frozen=True)
class Document:
    """One manifest of the stream: where it came from, what it is, and its YAML text."""

    source: str  # e.g. "npu-job/templates/job.yaml.j2"
    kind: str
    name: str
    text: str
    api_version: str = ""


@dataclass(frozen=True)
class RenderedJob:
    """Everything ``npu-job render`` produces for one spec, in a stable order."""

    spec: JobSpec
    # ConfigMap first, then (routing by the API) RBAC, any Service of the kind, the job object
    documents: Tuple[Document, ...]
    scripts: Tuple[
        Tuple[str, str], ...
    ]  # (file name, text): train.sh, [install.sh], [fetch-bundle.sh], [bootstrap.sh]
    warnings: Tuple[str, ...] = ()
    bundle: Optional[Bundle] = None  # the pod side, shipped in the ConfigMap (npu-job.pyz)

    def stream(self) -> str:
        """The documents as one multi-document YAML stream (what stdout gets)."""
        return "".join(f"---\n# Source: {doc.source}\n{doc.text}" for doc in self.documents)

    def files(self) -> Tuple[Tuple[str, Union[str, bytes], int], ...]:
        """(file name, data, mode) of what ``--output-dir`` writes: config.yaml, the scripts, then
        the bundle."""
        files: List[Tuple[str, Union[str, bytes], int]] = [("config.yaml", self.stream(), 0o644)]
        files += [(name, text, 0o755) for name, text in self.scripts]
        if self.bundle:
            files.append((BUNDLE_NAME, self.bundle.data, 0o755))
        return tuple(files)

    @property
    def job(self) -> Document:
        """The job object (the spec's kind's apiVersion and kind)."""
        kind = self.spec.job_kind
        return next(
            doc
            for doc in self.documents
            if (doc.api_version, doc.kind) == (kind.api_version, kind.kind)
        )

    @property
    def pod_command(self) -> str:
        """The shell command each pod runs (``bash -c``); what the job's container carries."""
        import yaml

        documents = [yaml.safe_load(doc.text) for doc in self.documents]
        pods = self.spec.job_kind.stream_pods(documents, self.job.source)
        return str(pods[0].template["spec"]["containers"][0]["command"][-1])


# --- kubectl apply's annotation ------------------------------------------------------------


def last_applied_configuration(document: Mapping[str, Any]) -> str:
    """The annotation ``kubectl apply`` (client-side) gives ``document``, as kubectl computes it.

    kubectl (``GetModifiedConfiguration``) takes the object as applied, sets its annotations
    without this one (an empty map when none is left) and encodes it with Go's ``encoding/json``:
    keys sorted, no spaces, ``<``, ``>`` and ``&`` escaped as ``\\u003c`` and the like, as are
    U+2028 and U+2029, other text as UTF-8, and a closing newline.
    """
    metadata = dict(document.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    annotations.pop(LAST_APPLIED_ANNOTATION, None)
    metadata["annotations"] = annotations
    text = json.dumps(
        {**document, "metadata": metadata},
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
    )
    return _GO_ESCAPED.sub(lambda match: f"\\u{ord(match.group()):04x}", text) + "\n"


_GO_ESCAPED = re.compile("[<>&\u2028\u2029]")


def annotations_after_apply(document: Mapping[str, Any]) -> int:
    """Bytes of ``document``'s annotations (keys and values) once ``kubectl apply`` has added its
    own: what the API server holds against :data:`ANNOTATIONS_LIMIT`."""
    annotations = dict((document.get("metadata") or {}).get("annotations") or {})
    annotations[LAST_APPLIED_ANNOTATION] = last_applied_configuration(document)
    return sum(
        len(key.encode("utf-8")) + len(value.encode("utf-8")) for key, value in annotations.items()
    )


def apply_size_warning(document: Mapping[str, Any]) -> Optional[str]:
    """A warning when ``kubectl apply`` (client-side) would take ``document`` near or past the
    annotation limit, else None."""
    size = annotations_after_apply(document)
    if size <= ANNOTATIONS_LIMIT * APPLY_WARN_SHARE:
        return None
    kind, name = document.get("kind"), (document.get("metadata") or {}).get("name")
    verdict = "past" if size > ANNOTATIONS_LIMIT else f"{size / ANNOTATIONS_LIMIT:.0%} of"
    return (
        f"{kind} {name}: kubectl apply (client-side) would give it {size} bytes of annotations "
        f"(its {LAST_APPLIED_ANNOTATION}), {verdict} the {ANNOTATIONS_LIMIT} the API server "
        "takes, which refuses the object past that; kubectl apply --server-side (or kubectl "
        "create) stores no such annotation"
    )


# --- filters --------------------------------------------------------------------------------


def yaml_scalar(value: Any) -> str:
    """``value`` as JSON text that YAML reads back exactly: a double-quoted scalar for strings.

    JSON escapes quotes, backslashes and control characters; on top of that every character YAML
    would not keep verbatim inside double quotes (DEL, C1 controls with NEL, the line and paragraph
    separators, BOM, non-characters) is written as a ``\\uXXXX`` escape, which means the same in
    JSON and YAML. Other non-ASCII text stays readable. (JSON's surrogate-pair escapes for
    characters beyond U+FFFF are avoided: YAML reads them as two lone surrogates.)
    """
    return _QUOTED_UNSAFE.sub(
        lambda match: f"\\u{ord(match.group()):04x}", json.dumps(value, ensure_ascii=False)
    )


_QUOTED_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def yaml_block(text: str, indent: int) -> str:
    """``text`` as a literal block scalar of a mapping key at column ``indent - 2``.

    Falls back to :func:`yaml_scalar` when a block cannot hold ``text`` exactly (characters YAML
    would normalise); the result is parsed back to prove it before it is used.
    """
    import yaml

    if text and not _BLOCK_UNSAFE.search(text):
        stripped = text.rstrip("\n")
        trailing = len(text) - len(stripped)
        chomp = "-" if trailing == 0 else "" if trailing == 1 else "+"
        indicator = "2" if text[0] in " \n" else ""
        pad = " " * indent
        body = "\n".join(pad + line if line else "" for line in stripped.split("\n"))
        block = f"|{indicator}{chomp}\n{body}" + "\n" * max(trailing - 1, 0)
        try:
            if yaml.safe_load(" " * (indent - 2) + f"k: {block}\n") == {"k": text}:
                return block
        except yaml.YAMLError:
            pass
    return yaml_scalar(text)


_BLOCK_UNSAFE = re.compile(
    r"[^\t\n\x20-\x7e\u00a0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]|[\u2028\u2029\ufeff]"
)


def kubelet_literal(value: str) -> str:
    """Escape ``value`` so kubelet's ``$(VAR)`` expansion gives back exactly ``value``.

    Kubelet turns ``$$`` into ``$`` and ``$(NAME)`` into NAME's value; every other ``$`` is kept.
    So a ``$`` needs doubling only when a ``$`` or ``(`` follows it.
    """
    return re.sub(r"\$(?=[$(])", "$$", value)


def shquote(value: Any) -> str:
    return shlex.quote(str(value))


# --- rendering -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    """The Jinja environment (cached: templates are package data and compile once per process)."""
    import jinja2

    def load(name: str) -> Tuple[str, str, Any]:
        # a file name lets Jinja map errors in rendering back to the template's line
        return _package_text(name), f"templates/{name}", lambda: True

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["tojson"] = yaml_scalar
    env.filters["yaml_block"] = yaml_block
    env.filters["shquote"] = shquote
    env.filters["kubelet_literal"] = kubelet_literal
    return env


def _package_text(name: str, package: str = TEMPLATE_PACKAGE) -> str:
    from importlib import resources

    try:
        if not hasattr(resources, "files"):  # Python 3.8
            return resources.read_text(package, name, encoding="utf-8")
        return resources.files(package).joinpath(name).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as error:
        folder = package.split(".")[-1]
        raise RenderError(f"{folder}/{name}: cannot read the packaged file: {error}") from None


def _render_template(env: Any, name: str, context: Mapping[str, Any]) -> str:
    import jinja2

    try:
        return env.get_template(name).render(**context)
    except jinja2.TemplateSyntaxError as error:
        raise RenderError(
            f"templates/{error.name or name}, line {error.lineno}: {error.message}"
        ) from None
    except jinja2.TemplateError as error:
        raise RenderError(f"templates/{name}, line {_template_line(name)}: {error}") from None


def _template_line(name: str) -> str:
    """The template line of the exception being handled (Jinja rewrites tracebacks to templates)."""
    tb = sys.exc_info()[2]
    line = "?"
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(name):
            line = str(tb.tb_lineno)
        tb = tb.tb_next
    return line


def _pairs(*groups: Tuple[Tuple[str, str], ...]) -> Tuple[Tuple[str, str], ...]:
    """Merge key/value groups in order, later groups winning, first position kept."""
    merged: Dict[str, str] = {}
    for group in groups:
        for key, value in group:
            merged[key] = value
    return tuple(merged.items())


def _context(spec: JobSpec) -> Dict[str, Any]:
    # CCE delivers the rank table (configmap1980) and the ToR topology (cabinet) to NPU Volcano
    # Jobs only; another routed job runs the same bootstrap on a rank table it brings itself
    npu_routing = spec.routing and spec.cce_rank_table and not spec.routes_by_api
    job_labels = _pairs(
        (MANAGED_BY,),
        (("fault-scheduling", "force"),) if spec.device == "npu" else (),
        (("ring-controller.cce", "ascend-1980"),) if npu_routing else (),
        spec.job_kind.restart_labels(spec.restart),
        spec.labels,
    )
    resources: List[Tuple[str, Any]] = []
    if spec.resource_name:
        resources.append((spec.resource_name, spec.npus_per_node))
    for key in ("cpu", "memory"):
        value = getattr(spec.resources, key)
        if value is not None:
            resources.append((key, value))
    kind = spec.job_kind
    return {
        "spec": spec,
        "kind": kind,
        # pods of any kind but the default say which they are (the pod side's --kind default)
        "kind_env": (KIND_ENV, kind.name) if kind.name != DEFAULT else None,
        "launcher_env_unset": tuple(
            name for name in kind.launcher_env if name not in TRAIN_SH_SETS
        ),
        # the bootstrap's files, as the pod command and train.sh read them (npu_job.podfacts)
        "rank_file": posixpath.join(podfacts.OUTPUT_DIR, podfacts.RANK_FILE),
        "master_file": posixpath.join(podfacts.OUTPUT_DIR, podfacts.MASTER_FILE),
        "env_file": posixpath.join(podfacts.OUTPUT_DIR, podfacts.ENV_FILE),
        "scripts_configmap": f"{spec.name}-scripts",
        "scripts_volume": SCRIPTS_VOLUME,
        "shm_volume": SHM_VOLUME,
        "npu_host_mounts": NPU_HOST_MOUNTS,
        "full_node_env": podfacts.FULL_NODE_ENV,
        "launcher_command": LAUNCHER_COMMANDS[spec.launcher],
        # the job's bundle: where train.sh finds it, and whether npu-run comes from it
        "bundle_name": BUNDLE_NAME,
        "bundle_env": podfacts.BUNDLE_ENV,
        "bundle_path": (
            podfacts.FETCHED_BUNDLE
            if spec.fetches_bundle
            else posixpath.join(spec.scripts_dir, BUNDLE_NAME)
        ),
        "bundle_launcher": spec.uses_bundle and spec.launcher == "npu-run",
        "bundle_exit": BundleError.exit_code,
        "launcher_python_env": podfacts.LAUNCHER_PYTHON_ENV,
        "python_env": podfacts.PYTHON_ENV,
        "bundle_base64": None,
        "job_labels": job_labels,
        "cce_routing": npu_routing,
        "configmap_labels": _pairs((MANAGED_BY,), spec.labels),
        "routes_by_api": spec.routes_by_api,
        "service_account": spec.routing_service_account,
        # cluster-scoped, so named after the namespace too (':' may be in an RBAC name, not in
        # a namespace or job name: no two jobs share one)
        "cluster_role": f"npu-job:{spec.namespace}:{spec.name}-routing",
        "pod_labels": _pairs((MANAGED_BY,), spec.labels),
        "pod_annotations": _pairs(
            (("cabinet", "cabinet"),) if npu_routing else (), spec.annotations
        ),
        "resources": tuple(resources),
        "node_selector": _pairs(spec.accelerator_node_selector, spec.node_selector),
    }


def bootstrap_script() -> str:
    """The bundled ``bootstrap.sh`` (scripts/bootstrap.sh, package data of ``npu_job.scripts``)."""
    return _package_text("bootstrap.sh", SCRIPTS_PACKAGE)


def render(
    spec: JobSpec, *, bootstrap: Optional[str] = None, bundle: Optional[Bundle] = None
) -> RenderedJob:
    """Render ``spec``; ``bootstrap`` and ``bundle`` stand in for the shipped bootstrap.sh and
    bundle (tests: their own changes would churn every golden file)."""
    import yaml

    for warning in spec.warnings:
        log.warning("%s", warning)
    env = _environment()
    context = _context(spec)
    context["pod_command"] = _render_template(env, "pod-command.sh.j2", context).strip()
    scripts: List[Tuple[str, str]] = [("train.sh", _render_template(env, "train.sh.j2", context))]
    if spec.pip_install:
        scripts.append(("install.sh", _render_template(env, "install.sh.j2", context)))
    if spec.fetches_bundle:
        scripts.append(("fetch-bundle.sh", _render_template(env, "fetch-bundle.sh.j2", context)))
    if spec.routing:
        scripts.append(("bootstrap.sh", bootstrap if bootstrap is not None else bootstrap_script()))
    shipped: Optional[Bundle] = None
    if spec.uses_bundle and not spec.fetches_bundle:
        shipped = bundle if bundle is not None else installed_bundle((spec.kind,))
        context["bundle_base64"] = base64.b64encode(shipped.data).decode("ascii")
    context["scripts"] = tuple(scripts)
    pod_template = _render_template(env, "pod.yaml.j2", context)
    context["pod_template"] = pod_template[:-1] if pod_template.endswith("\n") else pod_template

    kind = spec.job_kind
    templates = ["configmap.yaml.j2"]
    if spec.routes_by_api and spec.service_account is None:  # before the job whose pods use it
        templates.append("rbac.yaml.j2")
    templates.append(kind.template)
    documents: List[Document] = []
    warnings = list(spec.warnings)
    for template in templates:
        rendered = _render_template(env, template, context)
        for text in rendered.split("\n---\n"):  # a template may hold several documents
            if not text.endswith("\n"):
                text += "\n"
            try:
                parsed = yaml.safe_load(text)
            except yaml.YAMLError as error:
                raise RenderError(
                    f"templates/{template}: rendered text is not valid YAML: {error}"
                ) from None
            documents.append(
                Document(
                    SOURCE_PREFIX + template,
                    parsed["kind"],
                    parsed["metadata"]["name"],
                    text,
                    str(parsed.get("apiVersion", "")),
                )
            )
            too_big = apply_size_warning(parsed)
            if too_big is not None:
                log.warning("%s", too_big)
                warnings.append(too_big)
    return RenderedJob(
        spec, _job_object_last(documents, kind), tuple(scripts), tuple(warnings), shipped
    )


def _job_object_last(documents: List[Document], kind: JobKind) -> Tuple[Document, ...]:
    """The stream's order: what the job's pods need (the ConfigMap, the RBAC, a Service or
    runtime the kind's template emits beside the job object), in template order, then the job
    object, which must be there exactly once."""
    ours = (kind.api_version, kind.kind)
    jobs = [doc for doc in documents if (doc.api_version, doc.kind) == ours]
    if len(jobs) != 1:
        raise RenderError(
            f"templates/{kind.template}: expected one {kind.api_version} {kind.kind} (the "
            f"{kind.title}), rendered {len(jobs)}"
        )
    return tuple(doc for doc in documents if doc is not jobs[0]) + (jobs[0],)
