"""The bootstrap, start to end: locate, wait, read, identify, plan, write (the orchestration edge).

``npu-job bootstrap``, ``python -m npu_job.bootstrap`` and ``bootstrap.sh`` all end up in
:func:`bootstrap`. Its one promise: **never break the job**. Whatever goes wrong (no rank table,
bad JSON, timeout, this host missing, fewer than 3 nodes, even a bug of ours), it logs one
``npu-job: error: <file>: <field>: <what was expected>`` line, removes any stale rank files so the
pod command falls back to the job kind's index variable (a Volcano Job's ``VC_TASK_INDEX``) /
master index 0 (the scheduler order), writes a
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
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, NamedTuple, Optional

from npu_job.errors import EXIT_OK, InputError, NpuJobError, shown

from .base.model import Collective, Plan, PlanStatus, RankTable, Topology
from .base.payload import verbatim_or_shown
from .options import BootstrapOptions, resolve, resolve_one
from .sources import (
    Verify,
    is_url,
)

if TYPE_CHECKING:  # imported where used: a run reads its inputs before it reports on them
    from .nodereport import NodeReport

log = logging.getLogger(__name__)


class RunOutcome(NamedTuple):
    """How far one run got: what it read and decided, and the error that stopped it if one did.

    A failed run's route plan names what was known by then (:func:`_fall_back`).
    """

    rank_table: Optional[str] = None  # the rank table's location, once located
    pods: Optional[str] = None  # the job's pods' source, once they are all there (no rank table)
    node_count: Optional[int] = None
    table: Optional[RankTable] = None  # the servers, once read
    pod_index: Optional[int] = None
    topology: Optional[str] = None  # the topology's source ("none" if none was found)
    plan: Optional[Plan] = None
    report: Optional[NodeReport] = None  # this pod's, once its inputs are read
    route_plan: Optional[Dict[str, Any]] = None  # written: the plan gave an order
    error: Optional[Exception] = None  # what stopped the run; None: route_plan was written


class BootstrapResult(NamedTuple):
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
    # read alone, so that a bad value of another option still falls back to the scheduler's order
    strict = resolve_one("strict", flags, environ)
    output_dir = resolve_one("output_dir", flags, environ)
    keeping = f"continuing in scheduler order (RANK_AFTER_ACC={_scheduler_index(flags, environ)})"
    outcome = RunOutcome()
    failure: Optional[NpuJobError] = None
    try:
        options = resolve(flags, environ)
        output_dir = options.output_dir
        outcome = _run(options, environ, clock, sleep)
        if outcome.error is not None:
            raise outcome.error  # handled below like any error of resolve's
        assert outcome.route_plan is not None  # a run without an error wrote its plan
        route_plan = outcome.route_plan
    except NpuJobError as error:
        failure = error
    except Exception as error:  # a bug of ours must not stop the training job either
        first_line = (str(error).splitlines() or [""])[0]
        summary = f"{type(error).__name__}: {verbatim_or_shown(first_line)}"
        route_plan = _fall_back(
            output_dir, f"internal error: {summary}", outcome, _scheduler_pod(flags, environ)
        )
        if strict:
            raise
        log.error("internal error (a bug, please report it): %s", summary)
        log.debug("traceback", exc_info=True)
        log.info("%s", keeping)
    if failure is not None:
        route_plan = _fall_back(
            output_dir, failure.message, outcome, _scheduler_pod(flags, environ)
        )
        if strict:  # the error is the outcome --strict asks for
            raise failure
        log.error("%s", failure.message)
        if failure.tip:
            log.info("TIP: %s", failure.tip)
        log.info("%s; --strict makes this fatal", keeping)
    if flags.get("json"):
        sys.stdout.write(json.dumps(route_plan, indent=2, sort_keys=True) + "\n")
    return BootstrapResult(EXIT_OK, route_plan)


def _scheduler_index(flags: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """What the pod command's rank falls back to, for the log: the job kind's index variable
    (one that names no kind: this pod's scheduler index)."""
    try:
        return str(resolve_one("kind", flags, env).index_env)
    except NpuJobError:
        return "this pod's scheduler index"


def _scheduler_pod(flags: Mapping[str, Any], env: Mapping[str, str]) -> int:
    """This pod's scheduler index as its kind's variable gives it, for a node report written
    before the pod was found in its servers (-1 where the variable says nothing usable)."""
    from .identity import parse_task_index
    from .nodereport import UNKNOWN_POD_INDEX

    try:
        index = parse_task_index(resolve_one("pod_index", flags, env))
    except NpuJobError:
        return UNKNOWN_POD_INDEX
    return UNKNOWN_POD_INDEX if index is None else index


def _run(
    options: BootstrapOptions,
    env: Mapping[str, str],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> RunOutcome:
    """Plan and write this pod's files. Raises no ``Exception``: the outcome holds it, with
    what was known by then (a plan that gives no order is :func:`_not_planned`)."""
    from . import writers
    from .inputs import InPod, load_inputs
    from .nodereport import report_of

    outcome = RunOutcome()

    def noted(**fields: Any) -> None:
        nonlocal outcome
        outcome = outcome._replace(**fields)

    try:
        verify: Verify = options.ca_bundle or True
        inputs = load_inputs(options, verify, InPod(env, clock, sleep), noted)
        table, location, topology = inputs.table, inputs.table_source, inputs.topology
        topology_source, pod_index = inputs.topology_source, inputs.pod_index
        assert pod_index is not None  # a pod's inputs name the pod
        collective = choose_collective(options.collective)
        report = report_of(
            table, pod_index, topology, topology_source, collective, options.full_node_devices
        )
        outcome = outcome._replace(report=report)
        plan = _plan(table, topology, collective, options.full_node_devices)
        outcome = outcome._replace(plan=plan)
        log.info("input sha256 %s, mapping sha256 %s", plan.input_digest, plan.mapping_digest)
        if plan.status is not PlanStatus.SUCCESS:  # a result: fall back with its reasons
            return outcome._replace(error=_not_planned(plan, location))
        node_rank = plan.node_rank_of_pod[pod_index]
        master_addr = inputs.address_of(plan.master_index)
        route_plan = writers.route_plan_document(
            plan,
            node_count=table.node_count,
            pod_index=pod_index,
            rank_table=None if inputs.from_pods else location,
            topology=topology_source,
            pods=location if inputs.from_pods else None,
            master_addr=master_addr,
        )
        try:
            written = writers.write_plan_outputs(
                options.output_dir,
                node_rank=node_rank,
                master_index=plan.master_index,
                reordered_table=inputs.reorder(plan) if inputs.reorder is not None else None,
                route_plan=route_plan,
                original_rank_table=None if inputs.from_pods or is_url(location) else location,
                master_addr=master_addr,
                node_report=_report_data(report),
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
        return outcome._replace(route_plan=route_plan)
    except Exception as error:  # a bug of ours too: the caller falls back with what we knew
        return outcome._replace(error=error)


def _not_planned(plan: Plan, servers: str) -> NpuJobError:
    """How a plan that gives no order is reported (and what ``--strict`` exits with);
    ``servers`` names where they came from (the rank table, or the job's pods)."""
    return InputError(servers, "plan", "; ".join(plan.reasons) or "no usable order")


def _plan(
    table: RankTable,
    topology: Optional[Topology],
    collective: Collective,
    full_node_devices: Optional[int],
) -> Plan:
    from . import planner

    return planner.plan(table, topology, collective, full_node_devices=full_node_devices)


def choose_collective(name: Optional[str]) -> Collective:
    """The collective the options name (``--collective``, else what ``HCCL_ALGO`` implies: see
    :mod:`.options`), else ring."""
    if not name:
        return Collective.RING
    try:
        return Collective(name.strip().lower())
    except ValueError:
        choices = ", ".join(c.value for c in Collective)
        raise InputError(
            "--collective", "", f"expected one of {choices}, got {shown(name)}"
        ) from None


def _report_data(report: NodeReport) -> bytes:
    """``report`` encoded; past the size cap (ids that long), what fits: its pod index and
    device count (the rendezvous then plans the node without placement)."""
    from .nodereport import NodeReport, encode_report

    try:
        return encode_report(report)
    except InputError as error:
        log.warning("%s; writing this pod's index and device count only", error.message)
        return encode_report(
            NodeReport(pod_index=report.pod_index, device_count=report.device_count)
        )


def _known_report(outcome: RunOutcome, scheduler_pod: int) -> NodeReport:
    """This pod's report with what a run that stopped knew: its inputs' whole report, else its
    rank table entry (no placement), else its scheduler index alone."""
    from .nodereport import NodeReport, report_of

    if outcome.report is not None:
        return outcome.report
    if outcome.table is not None and outcome.pod_index is not None:
        return report_of(outcome.table, outcome.pod_index, None, outcome.topology or "")
    return NodeReport(pod_index=scheduler_pod)


def _fall_back(
    output_dir: str, reason: str, outcome: RunOutcome, scheduler_pod: int
) -> Dict[str, Any]:
    """Remove stale rank files and write a failed route plan and this pod's node report (what
    it knows, :func:`_known_report`; ``scheduler_pod``: the index its kind's variable gives);
    never raises."""
    from . import writers

    plan = outcome.plan
    route_plan = writers.route_plan_document(
        plan,
        node_count=outcome.node_count,
        pod_index=outcome.pod_index,
        rank_table=outcome.rank_table,
        topology=outcome.topology,
        error=None if plan is not None and plan.status is not PlanStatus.SUCCESS else reason,
        pods=outcome.pods,
    )
    try:
        report = _report_data(_known_report(outcome, scheduler_pod))
        writers.write_fallback_outputs(output_dir, route_plan, node_report=report)
    except Exception as error:  # an unwritable output dir must not turn a fallback into a crash
        log.warning("could not write %s: %s", output_dir, error)
    return route_plan
