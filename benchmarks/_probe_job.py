"""An npu-run job on the emulated fabric (bench_probe.py, tests/e2e/test_probe_fabric.py): one
agent per node namespace of a :class:`_fabric_net.Fabric`, each started from what its pod's
bootstrap leaves in its output directory.

A pod's bootstrap reads the ToR file and leaves its report (the node, its pod index, its ToR and
slot) in ``$NPU_JOB_OUTPUT_DIR``, and train.sh passes npu-run the rank the bootstrap planned:
:func:`start` writes those reports for a ToR file that puts pod ``p`` under ToR
``tor_of_pod[p]`` (the bridges' wiring, or another: a lying file) and starts every agent with
its planned rank, the ``parallel`` rendezvous with its root on pod index 0, one gloo device per
node and, when asked, ``--probe``. The root plans the round from the reports, as in a pod.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import _fabric_net as net
from npu_job.bootstrap.base.model import Placement
from npu_job.bootstrap.nodereport import NodeReport, encode_report, plan_round

from npu_job.podfacts import NODE_REPORT_FILE

PORT = 29500  # every fabric is namespaces of its own: no other run's port is there
TAG_VARIABLE = "NPU_RUN_TEST_TAG"  # tests.launcher.cluster's: its /proc lookups find the job
PROBE_FILE = "probe.json"


def reports(tor_of_pod: Sequence[int]) -> List[NodeReport]:
    """What each pod's bootstrap reports when the ToR file puts pod ``p`` under ToR
    ``tor_of_pod[p]``."""
    slots: Dict[int, int] = {}
    found = []
    for pod, tor in enumerate(tor_of_pod):
        slots[tor] = slots.get(tor, -1) + 1
        found.append(
            NodeReport(
                node_id=f"node-{pod}",
                pod_index=pod,
                pod_name=f"job-worker-{pod}",
                device_count=1,
                placement=Placement(tors=(f"tor-{tor}",), slot=slots[tor]),
            )
        )
    return found


def planned_ranks(tor_of_pod: Sequence[int]) -> Dict[int, int]:
    """Every pod's node rank in the plan the root makes from these pods' reports."""
    plan = plan_round({str(r.pod_index): encode_report(r) for r in reports(tor_of_pod)})
    return {pod: plan.node_rank[str(pod)] for pod in range(len(tor_of_pod))}


@dataclass
class ProbeJob:
    """The agents of one job, their logs and their output directories."""

    workdir: Path
    tag: str
    ranks: Mapping[int, int]  # pod -> the node rank its bootstrap planned
    agents: List[subprocess.Popen] = field(default_factory=list)

    def output_dir(self, pod: int) -> Path:
        return self.workdir / f"pod-{pod}"

    def log_path(self, pod: int) -> Path:
        return self.workdir / f"npu-run-{pod}.log"

    def log(self, pod: int) -> str:
        return self.log_path(pod).read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- pod {pod} ---\n{self.log(pod)}" for pod in range(len(self.ranks)))

    def probe_document(self, pod: int) -> Optional[dict]:
        """The pod's probe.json (None where it wrote none)."""
        path = self.output_dir(pod) / PROBE_FILE
        return json.loads(path.read_text()) if path.exists() else None


def start(
    fabric: net.Fabric,
    tor_of_pod: Sequence[int],
    workdir: Path,
    script: Sequence[str],
    *,
    probe: Optional[str],
    tag: str,
) -> ProbeJob:
    """Every pod's agent, its reports saying ``tor_of_pod``, running ``script`` (a path and its
    arguments) with ``--probe=<probe>`` (None: without the probe)."""
    job = ProbeJob(workdir, tag, planned_ranks(tor_of_pod))
    for pod, argv, env in commands(job, tor_of_pod, script, probe=probe):
        with open(job.log_path(pod), "wb") as log:
            job.agents.append(
                fabric.popen(pod, argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
    return job


def commands(
    job: ProbeJob,
    tor_of_pod: Sequence[int],
    script: Sequence[str],
    *,
    probe: Optional[str],
    master: Tuple[str, int] = (net.pod_ip(0), PORT),
    ifname: str = "eth0",
) -> Iterator[Tuple[int, List[str], Dict[str, str]]]:
    """Every pod's agent command and environment (writing its bootstrap's report first), the
    root at ``master``, gloo on ``ifname``: :func:`start`'s on the fabric, or a loopback job's
    (``bench_probe_off.py``)."""
    nodes = len(tor_of_pod)
    for report in reports(tor_of_pod):
        pod = report.pod_index
        output = job.output_dir(pod)
        output.mkdir(parents=True)
        (output / NODE_REPORT_FILE).write_bytes(encode_report(report))
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("PET_", "TORCHELASTIC_"))
            and key not in ("RANK_AFTER_ACC", "VC_TASK_INDEX")
        }
        env.update(
            {
                TAG_VARIABLE: job.tag,
                "NPU_JOB_OUTPUT_DIR": str(output),
                "GLOO_SOCKET_IFNAME": ifname,
                "OMP_NUM_THREADS": "1",
                "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5",
            }
        )
        argv = [
            sys.executable,
            "-m",
            "npu_job.launcher",
            f"--nnodes={nodes}",
            "--nproc_per_node=1",
            f"--node_rank={job.ranks[pod]}",
            "--rdzv_backend=parallel",
            f"--master_addr={master[0]}",
            f"--master_port={master[1]}",
            "--monitor_interval=0.1",
            *([f"--probe={probe}"] if probe is not None else []),
            "--rdzv_conf=join_timeout=300,keep_alive_interval=1,keep_alive_max_attempt=5",
            *script,
        ]
        yield pod, argv, env
