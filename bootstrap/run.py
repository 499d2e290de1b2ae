"""The bootstrap, start to end: locate, wait, read, identify, plan, write (the orchestration edge).

``npu-job bootstrap``, ``python -m npu_job.bootstrap`` and ``bootstrap.sh`` all end up in
:func:`bootstrap`. Its one promise: **never break the job**. Whatever goes wrong (no rank table,
bad JSON, timeout, this host missing, fewer than 3 nodes, even a bug of ours), it logs one
``npu-job: error: <file>: <field>: <what was expected>`` line, removes any stale rank files so the
pod command falls back to ``VC_TASK_INDEX`` / master index 0 (the scheduler order), writes a
``route_plan.json`` with ``status: failed`` and the reason, and returns 0. With ``strict`` (flag
``--strict`` or ``NPU_JOB_STRICT=1``) the error propagates instead, with its exit code.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from npu_job.bootstrap.model import Collective, Plan, PlanStatus, RankTable, Topology
from npu_job.bootstrap.payload import verbatim_or_shown
from npu_job.bootstrap.sources import (
    K8S_TOPOLOGY,
    KubernetesAPI,
    TopologyCandidate,
    Verify,
    is_url,
    locate_rank_table,
    read_bytes,
    topology_candidates,
)

from npu_job.errors import EXIT_OK, InputError, NpuJobError, shown
from npu_job.parsing import count_from_text, seconds_from_text
from npu_job.podfacts import OUTPUT_DIR, OUTPUT_DIR_ENV, TASK_INDEX_ENV

log = logging.getLogger(__name__)

DEFAULT_WAIT_TIMEOUT = 300.0
DEFAULT_POLL_INTERVAL = 5.0
_TRUE = ("1", "true", "yes", "on")

# A process that ends with os._exit right after the run (bootstrap.sh) sets this to a list: the run
# then leaves its decoded rank table there rather than freeing its ~10^6 objects one by one just
# before the process ends anyway (~4 ms at 4096 nodes). None (the default): nothing is retained.
KEEP_UNTIL_EXIT: Optional[List[Any]] = None


@dataclass(frozen=True)
class BootstrapOptions:
    """Every knob of the bootstrap; flags win over environment variables (see :func:`resolve`)."""

    rank_table: Optional[str] = None  # path, directory or URL; None: $RANK_TABLE_FILE, defaults
    topology: Optional[str] = None  # path, URL or "k8s"; None: $NPU_JOB_TOPOLOGY, then the chain
    topology_format: Optional[str] = None  # None: detect by content
    host_ip: Optional[str] = None  # this host's IP (MA_CURRENT_HOST_IP)
    pod_index: Optional[str] = None  # this pod's index (VC_TASK_INDEX), as text
    output_dir: str = OUTPUT_DIR
    collective: Optional[str] = None  # ring / nhr / rhd; None: HCCL_ALGO, else ring
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT
    poll_interval: float = DEFAULT_POLL_INTERVAL
    strict: bool = False
    ca_bundle: Optional[str] = None  # CA file for https:// inputs; None: the system's
    full_node_devices: Optional[int] = None  # devices of a full node; None: only equal counts


def resolve(flags: Mapping[str, Any], env: Mapping[str, str]) -> BootstrapOptions:
    """Options from parsed flags (None = not given) over the environment; bad values raise."""

    def pick(flag: str, *names: str) -> Optional[str]:
        value = flags.get(flag)
        if value is not None:
            return str(value)
        for name in names:
            if env.get(name):
                return env[name]
        return None

    def seconds(flag: str, name: str, default: float) -> float:
        value = flags.get(flag)
        if value is not None:
            return float(value)
        text = env.get(name, "").strip()
        if not text:
            return default
        number = seconds_from_text(text, zero_ok=True)
        if number is None:
            raise InputError(
                "environment", name, f"expected a number of seconds >= 0, got {shown(text)}"
            )
        return number

    def count(flag: str, name: str) -> Optional[int]:
        value = flags.get(flag)
        if value is not None:
            return int(value)
        text = env.get(name, "").strip()
        if not text:
            return None
        number = count_from_text(text)
        if number is None or number < 1:
            raise InputError(
                "environment", name, f"expected a whole number >= 1, got {shown(text)}"
            )
        return number

    strict_flag = flags.get("strict")
    return BootstrapOptions(
        rank_table=pick("rank_table"),
        topology=pick("topology"),
        topology_format=pick("topology_format", "NPU_JOB_TOPOLOGY_FORMAT"),
        host_ip=pick("host_ip", "MA_CURRENT_HOST_IP"),
        pod_index=pick("pod_index", TASK_INDEX_ENV),
        output_dir=pick("output_dir", OUTPUT_DIR_ENV) or OUTPUT_DIR,
        collective=pick("collective"),
        wait_timeout=seconds("wait_timeout", "NPU_JOB_WAIT_TIMEOUT", DEFAULT_WAIT_TIMEOUT),
        poll_interval=seconds("poll_interval", "NPU_JOB_POLL_INTERVAL", DEFAULT_POLL_INTERVAL),
        strict=bool(strict_flag) or env.get("NPU_JOB_STRICT", "").strip().lower() in _TRUE,
        ca_bundle=pick("ca_bundle", "NPU_JOB_CA_BUNDLE"),
        full_node_devices=count("full_node_devices", "NPU_JOB_FULL_NODE_DEVICES"),
    )


@dataclass(frozen=True)
class BootstrapResult:
    """What one bootstrap run decided: the route plan written, and the exit code to return."""

    exit_code: int
    route_plan: Dict[str, Any]


def bootstrap(
    flags: Mapping[str, Any],
    env: Optional[Mapping[str, str]] = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> BootstrapResult:
    """Run the bootstrap; never raises unless strict (see the module docstring)."""
    # A short-lived process that allocates ~10^6 acyclic objects (the decoded tables): the cyclic
    # collector would only rescan them over and over (~15% of a 4096-node run). Restored on exit.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _bootstrap(flags, env, clock, sleep)
    finally:
        if gc_was_enabled:
            gc.enable()


def _bootstrap(
    flags: Mapping[str, Any],
    env: Optional[Mapping[str, str]],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> BootstrapResult:
    environ = os.environ if env is None else env
    strict = bool(flags.get("strict")) or environ.get("NPU_JOB_STRICT", "").strip().lower() in _TRUE
    output_dir = flags.get("output_dir") or environ.get(OUTPUT_DIR_ENV) or OUTPUT_DIR
    context: Dict[str, Any] = {}
    failure: Optional[NpuJobError] = None
    try:
        options = resolve(flags, environ)
        output_dir = options.output_dir
        planned = _run(options, environ, clock, sleep, context)
        if planned is None:  # a plan that gives no order is a result: fall back with its reasons
            failure = _not_planned(context["plan"], context["rank_table"])
        else:
            route_plan = planned
    except NpuJobError as error:
        failure = error
    except Exception as error:  # a bug of ours must not stop the training job either
        first_line = (str(error).splitlines() or [""])[0]
        summary = f"{type(error).__name__}: {verbatim_or_shown(first_line)}"
        route_plan = _fall_back(output_dir, f"internal error: {summary}", context)
        if strict:
            raise
        log.error("internal error (a bug, please report it): %s", summary)
        log.debug("traceback", exc_info=True)
        log.info("continuing in scheduler order (RANK_AFTER_ACC=VC_TASK_INDEX)")
    if failure is not None:
        route_plan = _fall_back(output_dir, failure.message, context)
        if strict:  # the error is the outcome --strict asks for
            raise failure
        log.error("%s", failure.message)
        if failure.tip:
            log.info("TIP: %s", failure.tip)
        log.info(
            "continuing in scheduler order (RANK_AFTER_ACC=VC_TASK_INDEX); "
            "--strict makes this fatal"
        )
    if flags.get("json"):
        sys.stdout.write(json.dumps(route_plan, indent=2, sort_keys=True) + "\n")
    return BootstrapResult(EXIT_OK, route_plan)


def _run(
    options: BootstrapOptions,
    env: Mapping[str, str],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    context: Dict[str, Any],
) -> Optional[Dict[str, Any]]:
    """Plan and write this pod's files; the route plan, or None when the plan gives no order
    (``context["plan"]`` says why)."""
    from npu_job.bootstrap import identity, wait, writers
    from npu_job.bootstrap.ranktable import reordered_document

    verify: Verify = options.ca_bundle or True
    location = locate_rank_table(options.rank_table, env)
    context["rank_table"] = location
    log.debug("rank table: %s", location)
    loaded = wait.wait_for_rank_table(
        lambda: read_bytes(location, verify=verify),
        location,
        timeout=options.wait_timeout,
        interval=options.poll_interval,
        clock=clock,
        sleep=sleep,
    )
    table = loaded.table
    if KEEP_UNTIL_EXIT is not None:
        KEEP_UNTIL_EXIT.append(loaded)
    context["node_count"] = table.node_count
    pod_index = identity.find_pod_index(
        table, options.host_ip, identity.parse_task_index(options.pod_index), location
    )
    context["pod_index"] = pod_index
    topology, topology_source = load_topology(options, location, env, verify)
    context["topology"] = topology_source
    collective = choose_collective(options.collective, env)
    plan = _plan(table, topology, collective, options.full_node_devices)
    context["plan"] = plan
    log.info("input sha256 %s, mapping sha256 %s", plan.input_digest, plan.mapping_digest)
    if plan.status is not PlanStatus.SUCCESS:
        return None
    node_rank = plan.node_rank_of_pod[pod_index]
    route_plan = writers.route_plan_document(
        plan,
        node_count=table.node_count,
        pod_index=pod_index,
        rank_table=location,
        topology=topology_source,
    )
    try:
        written = writers.write_plan_outputs(
            options.output_dir,
            node_rank=node_rank,
            master_index=plan.master_index,
            # the run owns this freshly decoded document and only serialises the result
            reordered_table=reordered_document(loaded.document, table, plan, in_place=True),
            route_plan=route_plan,
            original_rank_table=None if is_url(location) else location,
        )
    except OSError as error:
        raise InputError(
            options.output_dir,
            "output directory",
            f"expected a writable directory ({error.strerror or error})",
        ) from None
    for note in plan.reasons:
        log.info("note: %s", note)
    log.info(
        "node rank %d of %d (pod index %d), master index %d, %s order on %s; wrote %s",
        node_rank,
        table.node_count,
        pod_index,
        plan.master_index,
        collective,
        topology_source,
        written[-1],
    )
    return route_plan


def _not_planned(plan: Plan, rank_table: str) -> NpuJobError:
    """How a plan that gives no order is reported (and what ``--strict`` exits with)."""
    return InputError(rank_table, "plan", "; ".join(plan.reasons) or "no usable order")


def _plan(
    table: RankTable,
    topology: Optional[Topology],
    collective: Collective,
    full_node_devices: Optional[int],
) -> Plan:
    from npu_job.bootstrap import planner

    return planner.plan(table, topology, collective, full_node_devices=full_node_devices)


def choose_collective(flag: Optional[str], env: Mapping[str, str]) -> Collective:
    """``--collective``, else what ``HCCL_ALGO`` implies, else ring."""
    if flag:
        try:
            return Collective(flag.strip().lower())
        except ValueError:
            choices = ", ".join(c.value for c in Collective)
            raise InputError(
                "--collective", "", f"expected one of {choices}, got {shown(flag)}"
            ) from None
    from npu_job.bootstrap import planner

    algo = env.get("HCCL_ALGO")
    chosen = planner.collective_from_hccl_algo(algo)
    if chosen is not None:
        log.debug("collective %s from HCCL_ALGO=%s", chosen, algo)
        return chosen
    return Collective.RING


def load_topology(
    options: BootstrapOptions, rank_table: str, env: Mapping[str, str], verify: Verify
) -> Tuple[Optional[Topology], str]:
    """The first topology found (see :func:`~npu_job.bootstrap.sources.topology_candidates`).

    Returns ``(None, "none")`` when there is none. A source named explicitly must work; an
    automatic one that is absent, or (Kubernetes API) refuses us, is skipped with a log line.
    """
    from npu_job.bootstrap.topology import parse_topology

    chain = topology_candidates(options.topology, options.topology_format, rank_table, env)
    for candidate in chain:
        found = _read_candidate(candidate, env, verify)
        if found is None:
            continue
        data, name = found
        topology = parse_topology(data, name, candidate.fmt)
        if not topology.placements and not candidate.required:
            log.info("topology: %s places no server; trying the next source", name)
            continue
        log.info("topology: %s (%s, %d entries)", name, topology.source, len(topology.placements))
        return topology, f"{name} ({topology.source})"
    log.info("topology: none found")
    return None, "none"


def _read_candidate(
    candidate: TopologyCandidate, env: Mapping[str, str], verify: Verify
) -> Optional[Tuple[bytes, str]]:
    if candidate.location == K8S_TOPOLOGY:
        api = KubernetesAPI.from_env(env)
        if api is None:
            if candidate.required:
                raise InputError(
                    "Kubernetes API",
                    "KUBERNETES_SERVICE_HOST",
                    "expected in-cluster credentials (service host and a service account token)",
                )
            return None
        try:
            # in the automatic chain the API is optional: do not hold the pod up for it
            data = api.node_list(quick=not candidate.required)
            return data, f"{api.base_url}/api/v1/nodes"
        except InputError as error:
            if candidate.required:
                raise
            log.info("topology: skipping Kubernetes node labels: %s", error.message)
            return None
    absent = not is_url(candidate.location) and not os.path.exists(candidate.location)
    if absent and not candidate.required:
        return None
    return read_bytes(candidate.location, verify=verify), candidate.location


def _fall_back(output_dir: str, reason: str, context: Mapping[str, Any]) -> Dict[str, Any]:
    """Remove stale rank files and write a failed route plan; never raises."""
    from npu_job.bootstrap import writers

    plan: Optional[Plan] = context.get("plan")
    route_plan = writers.route_plan_document(
        plan,
        node_count=context.get("node_count"),
        pod_index=context.get("pod_index"),
        rank_table=context.get("rank_table"),
        topology=context.get("topology"),
        error=None if plan is not None and plan.status is not PlanStatus.SUCCESS else reason,
    )
    try:
        writers.write_fallback_outputs(output_dir, route_plan)
    except Exception as error:  # an unwritable output dir must not turn a fallback into a crash
        log.warning("could not write %s: %s", output_dir, error)
    return route_plan
