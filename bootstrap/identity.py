"""Who am I: this pod's index in the rank table (pure).

The pod finds itself by ``MA_CURRENT_HOST_IP`` (the node's ``status.hostIP``) matching a server's
``server_id`` (or its ``host_ip`` where the format has one, v1.2+). The scheduler's pod index,
which the job's kind's controller sets (its :attr:`~npu_job.kinds.base.JobKind.index_env`: a
Volcano Job's ``VC_TASK_INDEX``), must agree: on CCE ``server_list`` is in pod-index order, and for
a legacy ``group_list`` table the ``pod_name`` suffix gives the index. Any disagreement is an
:class:`InconsistentError` naming that variable; nothing is guessed silently. Without a host IP
the pod index alone is used (and said so in the log).

Before that, :func:`check_job_nodes` holds the table to the job's node count, which every pod of
the job is given alike (``MA_NUM_HOSTS``): a table listing another number of servers is refused on
every pod the same way, where this host's own match could only refuse it on the pods it leaves
out.
"""

from __future__ import annotations

import logging
from typing import Optional

from npu_job.kinds import DEFAULT, KINDS

from npu_job.errors import InconsistentError, InputError, shown
from npu_job.parsing import count_from_text

from .base.model import RankTable

log = logging.getLogger(__name__)

DEFAULT_INDEX_ENV = KINDS[DEFAULT].index_env


def parse_task_index(value: Optional[str], name: str = DEFAULT_INDEX_ENV) -> Optional[int]:
    """This pod's index (the variable ``name``, a kind's ``index_env``) as an int (None when unset
    or empty)."""
    if value is None or value.strip() == "":
        return None
    index = count_from_text(value.strip())
    if index is None:
        raise InputError(
            "environment", name, f"expected a non-negative integer pod index, got {shown(value)}"
        )
    return index


def check_job_nodes(
    table: RankTable, nnodes: Optional[int], source: str, named: str = "MA_NUM_HOSTS"
) -> None:
    """Refuse a rank table that lists other than ``nnodes`` servers (None: not known, no check);
    ``named`` says where the count came from."""
    if nnodes is None or table.node_count == nnodes:
        return
    raise InconsistentError(
        f"{source}: server_count: {table.node_count} servers, but the job has {nnodes} nodes "
        f"({named})",
        tip="the rank table must be this job's, with every pod in it; the job runs in scheduler "
        "order until it is",
    )


def find_pod_index(
    table: RankTable,
    host_ip: Optional[str],
    task_index: Optional[int],
    source: str,
    *,
    entries: str = "server_list",
    what: str = "the rank table",
    ids: str = "server ids",
    index_env: str = DEFAULT_INDEX_ENV,
) -> int:
    """The pod index of this pod in ``table``; see the module docstring for the rules.
    ``entries`` and ``what`` name the servers' source in messages (a job's pods have no
    ``server_list``), ``index_env`` the variable ``task_index`` came from (the job kind's)."""
    count = table.node_count
    if host_ip:
        matches = [s.pod_index for s in table.servers if s.server_id == host_ip]
        if not matches:
            matches = [s.pod_index for s in table.servers if s.host_ip == host_ip]
        if not matches:
            raise InconsistentError(
                f"{source}: {entries}: expected this host's IP {shown(host_ip)} "
                f"(MA_CURRENT_HOST_IP) among the {count} {ids}, it is not there",
                tip="is MA_CURRENT_HOST_IP set from status.hostIP? --host-ip overrides it",
            )
        if len(matches) > 1:
            raise InconsistentError(
                f"{source}: {entries}: expected one server with host IP {shown(host_ip)}, "
                f"found {len(matches)}"
            )
        index = matches[0]
        if task_index is not None and task_index != index:
            raise InconsistentError(
                f"{source}: {entries}[{index}]: this host {shown(host_ip)} is pod index {index} "
                f"in {what}, but {index_env} is {task_index}",
                tip="the rank table may be stale or out of pod order; "
                "--pod-index/--host-ip override",
            )
        return index
    if task_index is not None:
        if task_index >= count:
            raise InconsistentError(
                f"{source}: {entries}: expected an entry for {index_env} {task_index}, "
                f"{what} lists {count}"
            )
        log.info("MA_CURRENT_HOST_IP is not set; this pod is index %d by %s", task_index, index_env)
        return task_index
    raise InputError(
        "environment",
        "MA_CURRENT_HOST_IP",
        f"expected this host's IP (or {index_env}, or --host-ip/--pod-index), neither is set",
    )
