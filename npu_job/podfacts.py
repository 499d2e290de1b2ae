"""The pod's facts: the names and rules every part of npu-job agrees on about a training pod.

The bootstrap writes these files, the rendered pod command and ``train.sh`` read them, npu-run
looks for them, and the demo's simulated pods carry them; each name is defined here once and
imported by the part that uses it (templates receive them from the renderer). Nothing here does
anything: only constants, so the bootstrap's small interpreter start pays nothing for them.
"""

from __future__ import annotations

#: Where the bootstrap writes its files unless told otherwise (``--output-dir``,
#: ``$NPU_JOB_OUTPUT_DIR``); the routing-acceleration guide's pod command reads them from there.
OUTPUT_DIR = "/tmp"
OUTPUT_DIR_ENV = "NPU_JOB_OUTPUT_DIR"

#: This pod's new node rank (one line); also the pod command's environment variable of that name.
RANK_FILE = "RANK_AFTER_ACC"
RANK_ENV = "RANK_AFTER_ACC"
#: The pod index (scheduler order) of the new node rank 0: the pod that hosts the root store.
MASTER_FILE = "MASTER_INDEX"
#: The bootstrap's whole decision (planned or not, why, the mapping and its digest), as JSON.
ROUTE_PLAN_FILE = "route_plan.json"
#: This pod's node report (JSON: its node id, pod index, device count and switch placement, as the
#: bootstrap resolved them; written also when it cannot plan), which npu-run sends when it joins
#: the rendezvous, for the root to plan each round (npu_job.bootstrap.nodereport).
NODE_REPORT_FILE = "npu_job_node.json"
#: npu-run's plan for its latest rendezvous round (JSON: the round, the plan's mapping digest,
#: this node's rank, the node count), written before that round's workers start: where a worker
#: checks its place once a replaced pod moved the ranks away from the bootstrap's plan.
ROUND_PLAN_FILE = "npu_job_round.json"
#: The rank table with its servers in the new order, for HCCL.
RANK_TABLE_COPY = "jobstart_hccl.reordered.json"
#: ``export`` lines of the plan's variables, for a shell to source.
ENV_FILE = "npu_job_env.sh"
#: The address of the pod holding the new node rank 0, in ENV_FILE: how train.sh reaches the
#: master on a kind whose pods have no DNS name.
MASTER_ADDR_ENV = "NPU_JOB_MASTER_ADDR"

#: A rank table the job brings itself (a path or an http(s) URL), where CCE delivers none.
RANK_TABLE_ENV = "RANK_TABLE_FILE"
#: Makes the bootstrap exit non-zero when it cannot plan (as ``--strict`` does).
STRICT_ENV = "NPU_JOB_STRICT"
#: Where the job's bundle is when it is not beside bootstrap.sh (``bootstrap.url`` downloads it
#: there); bootstrap.sh and train.sh read it.
BUNDLE_ENV = "NPU_JOB_BUNDLE"
FETCHED_BUNDLE = "/tmp/npu-job.pyz"
#: How much of the bundle's digest (``sha256:<hex>``) the pod's identity line shows: the algorithm
#: and 12 hex digits.
SHOWN_DIGEST = len("sha256:") + 12
#: The interpreter train.sh runs npu-run on, where it is not $NPU_JOB_PYTHON (an image whose
#: python3 lacks torch).
LAUNCHER_PYTHON_ENV = "NPU_JOB_LAUNCHER_PYTHON"
#: The interpreter bootstrap.sh runs (default: python3 on PATH).
PYTHON_ENV = "NPU_JOB_PYTHON"
#: The devices of a full node, which render passes to routed pods and the bootstrap reads
#: (``--full-node-devices``): a rank table listing other counts is not reordered.
FULL_NODE_ENV = "NPU_JOB_FULL_NODE_DEVICES"

#: Where CCE's configmap1980 plugin and MindX mount the rank table, in the order they are tried.
RANK_TABLE_NAME = "jobstart_hccl.json"
MINDX_RANK_TABLE_NAME = "hccl.json"
DEFAULT_RANK_TABLES = (
    "/user/config/jobstart_hccl.json",  # CCE configmap1980 plugin, ConfigMap ranktable-<job>
    "/user/serverid/devindex/config/hccl.json",  # MindX, ConfigMap rings-config-<job>
)
#: CCE's switch topology file, beside the rank table.
RANKTABLE_TOR_NAME = "ranktable_tor.json"

#: The platform's rule: routing acceleration needs at least this many nodes.
MIN_NODES = 3
