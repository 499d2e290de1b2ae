"""One run of the ``parallel`` rendezvous: its settings, checked once, and its keys in the root.

:func:`settings_from_params` reads torch's ``RendezvousParameters`` (what ``--rdzv_conf``,
``--nnodes``, ``--node_rank`` and the endpoint became) into :class:`ParallelSettings`, or raises
one ``LaunchError`` line naming the flag. :class:`RunKeys` names every key the agents keep in the
root store, all under ``npu_run/<run_id>/`` (per round, like torch's
``torch.rendezvous.<run_id>.<round>`` prefix); everything else in the root belongs to workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from npu_job.errors import LaunchError
from npu_job.parsing import count_from_text, seconds_from_text

from . import liveness
from .liveness import LivenessSettings

TIERED_OPTION = "enable_tiered_parallel_tcpstore"
NODE_ORDER_OPTION = "node_order"  # which node order this node's rank belongs to (npu-run sets it)
NODE_REPORT_OPTION = "node_report"  # this node's report (npu_job_node.json's text; npu-run sets it)
POD_INDEX_OPTION = "pod_index"  # this pod's scheduler index, from its report (npu-run sets it)
PROBE_OPTION = "probe"  # npu-run --probe: a ProbeRequest's text (npu-run sets it)
KEY_ROOT = "npu_run"

if TYPE_CHECKING:  # the probe is imported only when asked for (the pod bundle leaves it out)
    from ..probe.launch import ProbeRequest

DEFAULT_STORE_TIMEOUT = 900.0  # torch's LaunchConfig default for rdzv_configs["timeout"]
DEFAULT_JOIN_TIMEOUT = 600.0  # torch's c10d join_timeout
DEFAULT_CLOSE_TIMEOUT = 10.0
DEFAULT_WATCH_INTERVAL = 1.0
DEFAULT_LAST_CALL = 30.0  # torch's c10d last_call_timeout


@dataclass(frozen=True)
class ParallelSettings:
    """Everything the ``parallel`` backend needs, checked once (see :func:`settings_from_params`).

    ``store_timeout`` is the root store's operation timeout (``--rdzv_conf timeout=``, torch's
    name); ``join_timeout`` bounds each round's wait for all nodes (and the first connection);
    ``min_nodes`` and ``last_call`` (``--nnodes=MIN:MAX``, ``--rdzv_conf last_call_timeout=``)
    make it elastic: a round closes with MAX nodes, or with MIN or more once ``last_call``
    seconds passed without another joining, as torch's c10d does;
    ``close_timeout`` is how long node rank 0 keeps the root alive at the end for the other
    agents to sign off; ``watch_interval`` is the least time between two looks for a restarting
    node (the agent asks every ``--monitor_interval``, which is 0.1 s by default).

    ``node_rank`` is this node's hint (``--node_rank``: its bootstrap's rank, or its pod index);
    the root's plan of each round gives the rank it runs with. ``report`` is the node report it
    publishes when it joins (empty: an unknown one is made from the hint), ``pod_index`` the
    scheduler index that report names (None: unknown, the hint stands for it): pod index 0
    hosts the root (:attr:`hosts_root`). ``node_order`` names the order the hint belongs to (the
    bootstrap's mapping digest, or the scheduler order), which the root compares with its plan.
    """

    run_id: str
    master_addr: str
    master_port: int
    node_rank: int
    nnodes: int
    tiered: bool = False
    store_timeout: float = DEFAULT_STORE_TIMEOUT
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT
    watch_interval: float = DEFAULT_WATCH_INTERVAL
    node_order: Optional[str] = None
    keep_alive_interval: float = liveness.DEFAULT_INTERVAL
    keep_alive_max_attempt: int = liveness.DEFAULT_MAX_ATTEMPT
    pod_index: Optional[int] = None
    report: bytes = b""
    probe: Optional[ProbeRequest] = None  # npu-run --probe: probe each round's plan (None: off)
    min_nodes: Optional[int] = None  # elastic --nnodes=MIN:MAX (None: static, nnodes is both)
    last_call: float = DEFAULT_LAST_CALL

    @property
    def elastic(self) -> bool:
        """``--nnodes=MIN:MAX`` with MIN < MAX: the root's host decides when a round closes."""
        return self.min_nodes is not None and self.min_nodes < self.nnodes

    @property
    def fewest_nodes(self) -> int:
        """The least number of nodes a round runs with (MIN; ``nnodes`` when static)."""
        return self.nnodes if self.min_nodes is None else self.min_nodes

    @property
    def hosts_root(self) -> bool:
        """This agent hosts the root store: its pod is the scheduler's pod index 0 (without a
        report, its ``--node_rank`` is 0), which stays at one address across pod replacements."""
        return (self.node_rank if self.pod_index is None else self.pod_index) == 0

    @property
    def root(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @property
    def liveness(self) -> LivenessSettings:
        return LivenessSettings(self.keep_alive_interval, self.keep_alive_max_attempt)

    @property
    def call_timeout(self) -> float:
        """How long an agent waits for the root to answer one call: the store timeout, or the
        liveness window if shorter (a root silent that long is as dead as a silent node)."""
        return min(self.store_timeout, self.liveness.window)


def _seconds(params: RendezvousParameters, key: str, default: float) -> float:
    raw = params.get(key, default)
    value = seconds_from_text(str(raw), zero_ok=False)
    if value is None:
        raise LaunchError(f"--rdzv_conf: {key}: expected a positive number of seconds, got {raw!r}")
    return value


def settings_from_params(params: RendezvousParameters) -> ParallelSettings:
    """Check torch's rendezvous parameters for the ``parallel`` backend (LaunchError if wrong)."""
    if "rank" not in params.config:
        raise LaunchError(
            "the parallel rendezvous needs this node's rank: pass --node_rank to npu-run "
            "(plain torchrun hands --node_rank only to its static backend: pass --rdzv_conf rank=N)"
        )
    try:
        node_rank = int(params.config["rank"])
    except (TypeError, ValueError):
        raise LaunchError(
            f"--node_rank: expected an integer, got {params.config['rank']!r}"
        ) from None
    if not 0 <= node_rank < params.max_nodes:
        raise LaunchError(
            f"--node_rank={node_rank}: expected 0..{params.max_nodes - 1} for "
            f"--nnodes={params.max_nodes}"
        )
    if not params.endpoint.strip():
        raise LaunchError(
            "the parallel rendezvous needs the root store: pass --master_addr/--master_port"
        )
    try:
        host, port = parse_rendezvous_endpoint(params.endpoint, -1)
    except ValueError as error:
        raise LaunchError(f"--rdzv_endpoint={params.endpoint!r}: {error}") from None
    if not 0 < port < 2**16:
        raise LaunchError(
            f"--rdzv_endpoint={params.endpoint!r}: expected host:port with a port 1..65535"
        )
    try:
        tiered = bool(params.get_as_bool(TIERED_OPTION, False))
    except ValueError:
        raise LaunchError(
            f"--{TIERED_OPTION}: expected true or false, got {params.get(TIERED_OPTION)!r}"
        ) from None
    attempts_text = str(params.get("keep_alive_max_attempt", liveness.DEFAULT_MAX_ATTEMPT))
    attempts = count_from_text(attempts_text)
    if attempts is None or attempts < 1:
        raise LaunchError(
            f"--rdzv_conf: keep_alive_max_attempt: expected a whole number >= 1, "
            f"got {attempts_text!r}"
        )
    interval = _seconds(params, "keep_alive_interval", liveness.DEFAULT_INTERVAL)
    pod_index_text = str(params.get(POD_INDEX_OPTION, "") or "")
    pod_index = count_from_text(pod_index_text) if pod_index_text else None
    if pod_index_text and pod_index is None:
        raise LaunchError(
            f"--rdzv_conf: {POD_INDEX_OPTION}: expected a whole number >= 0, got {pod_index_text!r}"
        )
    report = params.get(NODE_REPORT_OPTION) or b""
    probe_text = str(params.get(PROBE_OPTION) or "")
    try:
        probe = None
        if probe_text:
            from ..probe.launch import ProbeRequest

            probe = ProbeRequest.from_text(probe_text)
    except ValueError as error:
        raise LaunchError(f"--rdzv_conf: {PROBE_OPTION}: {error}") from None
    return ParallelSettings(
        run_id=params.run_id,
        master_addr=host,
        master_port=port,
        node_rank=node_rank,
        nnodes=params.max_nodes,
        tiered=tiered,
        store_timeout=_seconds(params, "timeout", DEFAULT_STORE_TIMEOUT),
        join_timeout=_seconds(params, "join_timeout", DEFAULT_JOIN_TIMEOUT),
        close_timeout=_seconds(params, "close_timeout", DEFAULT_CLOSE_TIMEOUT),
        watch_interval=_seconds(params, "watch_interval", DEFAULT_WATCH_INTERVAL),
        node_order=str(params.get(NODE_ORDER_OPTION) or "") or None,
        keep_alive_interval=interval,
        keep_alive_max_attempt=attempts,
        pod_index=pod_index,
        report=report.encode() if isinstance(report, str) else bytes(report),
        probe=probe,
        min_nodes=params.min_nodes if params.min_nodes < params.max_nodes else None,
        last_call=_seconds(params, "last_call_timeout", DEFAULT_LAST_CALL),
    )


@dataclass(frozen=True)
class RunKeys:
    """Key names of one job in the root store (agents' keys only; workers own the rest)."""

    run_id: str

    @property
    def base(self) -> str:
        return f"{KEY_ROOT}/{self.run_id}"

    @property
    def closed(self) -> str:
        return f"{self.base}/closed"

    @property
    def departed(self) -> str:
        return f"{self.base}/departed"

    @property
    def members(self) -> str:
        """The counter that gives every agent of the run its member number (from 1)."""
        return f"{self.base}/members"

    def round(self, number: int) -> str:
        return f"{self.base}/round{number}"

    def worker_store(self, number: int) -> str:
        return f"{self.round(number)}/worker_store_port"

    def node(self, number: int, hint: int) -> str:
        """Counts the agents of round ``number`` that came with ``--node_rank=hint``."""
        return f"{self.round(number)}/node/{hint}"

    def slot(self, number: int, position: int) -> str:
        """The member number of the ``position``-th agent (from 1) to join round ``number``."""
        return f"{self.round(number)}/slot/{position}"

    def report(self, number: int, member: int) -> str:
        """The node report member ``member`` published joining round ``number``."""
        return f"{self.round(number)}/report/{member}"

    def claim(self, number: int, member: int) -> str:
        """What member ``member``'s bootstrap said (its hint and order), joining ``number``."""
        return f"{self.round(number)}/claim/{member}"

    def plan(self, number: int) -> str:
        """The root's plan of round ``number`` (a RoundPlan's bytes)."""
        return f"{self.round(number)}/plan"

    def joined(self, number: int) -> str:
        return f"{self.round(number)}/joined"

    def complete(self, number: int) -> str:
        return f"{self.round(number)}/complete"

    def ready(self, number: int) -> str:
        return f"{self.round(number)}/ready"

    def probe(self, number: int) -> str:
        """The prefix of round ``number``'s probe keys (``npu-run --probe``)."""
        return f"{self.round(number)}/probe"

    def agent_prefix(self, number: int) -> str:
        return f"{self.round(number)}/agent"

    @property
    def root_identity(self) -> str:
        return f"{self.base}/root"

    def who(self, member: int) -> str:
        return f"{self.base}/who/{member}"

    def alive(self, member: int) -> str:
        return f"{self.base}/alive/{member}"

    @property
    def verdict(self) -> str:
        return f"{self.base}/verdict"

    @property
    def verdict_claims(self) -> str:
        return f"{self.base}/verdict_claims"

    @property
    def failures(self) -> str:
        return f"{self.base}/failures"

    @property
    def failures_count(self) -> str:
        return f"{self.base}/failures_count"

    @property
    def lost(self) -> str:
        """Counts the members an elastic job went on without (each makes every agent restart)."""
        return f"{self.base}/lost"
