"""The rendered pod command, run for a 3-pod job on this machine up to the launcher's start.

Each "pod" is a real bash running the Job's container command in its own mount namespace
(``unshare``, root) with a private, initially empty /tmp, as a pod has, and with the env a Volcano pod gets:
the Job's env entries (fieldRefs resolved the way the kubelet would: status.hostIP, the
volcano.sh/job-name and volcano.sh/task-spec annotations), ``VC_TASK_INDEX`` from the env plugin,
and the scripts ConfigMap's files at the mount path. The launcher is a fake first on PATH that
prints its argv/env and the rank files it can see; no Kubernetes is involved (none can run here).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest
from npu_job.render.render import RenderedJob, render

from tests.e2e.netns import private_tmp_shell

from .conftest import container, job_of, parsed, spec_from, with_keys
from .test_scripts import kubelet_expand, make_fake_bin, write_fake_bundle

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for per-pod /tmp",
)

POD_ROOT = "/mnt"  # the test's workspace appears here inside each pod's mount namespace
HOSTS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def rank_table(hosts: List[str]) -> Dict[str, Any]:
    """A completed CCE rank table v1.0: server_list in pod-index order, 8 devices each."""
    return {
        "status": "completed",
        "version": "1.0",
        "server_count": str(len(hosts)),
        "server_list": [
            {
                "server_id": host,
                "host_ip": host,
                "device": [
                    {
                        "device_id": str(d),
                        "device_ip": f"192.168.{i}.{d + 1}",
                        "rank_id": str(i * 8 + d),
                    }
                    for d in range(8)
                ],
            }
            for i, host in enumerate(hosts)
        ],
    }


def pod_env(rendered: RenderedJob, index: int) -> Dict[str, str]:
    """The env the kubelet gives pod ``index`` of the rendered Job."""
    job = job_of(rendered)
    fields = {
        "status.hostIP": HOSTS[index],
        "metadata.annotations['volcano.sh/job-name']": job["metadata"]["name"],
        "metadata.annotations['volcano.sh/task-spec']": job["spec"]["tasks"][0]["name"],
    }
    env: Dict[str, str] = {"VC_TASK_INDEX": str(index)}
    for item in container(job)["env"]:
        if "value" in item:
            env[item["name"]] = kubelet_expand(item["value"], env)
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def run_pods(rendered: RenderedJob, workspace: Path) -> List[Dict[str, Any]]:
    """Run every pod's command concurrently; return each fake launcher's report."""
    configmap = parsed(rendered)[0]
    scripts = workspace / "scripts"
    scripts.mkdir()
    for name, text in configmap["data"].items():  # what the ConfigMap volume holds
        (scripts / name).write_text(text)
    bin_dir = make_fake_bin(workspace / "bin", names=("npu-run", "torchrun"))
    for name, encoded in configmap.get("binaryData", {}).items():
        # the job's bundle, but for its npu-run: the fake launcher, which reports what it got
        (bin_dir / f"real-{name}").write_bytes(base64.b64decode(encoded))
        inside = Path(POD_ROOT) / "bin"  # the workspace as the pods see it
        write_fake_bundle(scripts / name, inside / "npu-run", real_bundle=inside / f"real-{name}")
    command = container(job_of(rendered))["command"]
    pod_command = kubelet_expand(command[2], {})
    procs = []
    for index in range(rendered.spec.nodes):
        pod_tmp = workspace / f"pod-tmp-{index}"  # the pod's private, initially empty /tmp
        pod_tmp.mkdir(mode=0o1777)
        enter = f'mount --bind "$1" {POD_ROOT} && {private_tmp_shell(str(pod_tmp))} && shift && exec "$@"'
        env = dict(os.environ, PATH=f"{POD_ROOT}/bin:{os.environ['PATH']}")
        env.update(pod_env(rendered, index))
        procs.append(
            subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "bash",
                    "-c",
                    enter,
                    "pod",
                    str(workspace),
                    *command[:2],
                    pod_command,
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    reports = []
    for index, proc in enumerate(procs):
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, f"pod {index}: exit {proc.returncode}\n{err}"
        report = json.loads(out)
        report["stderr"] = err
        reports.append(report)
    assert bin_dir.exists()
    return reports


def routed_spec(**extra: Any):
    env = {
        "RANK_TABLE_FILE": f"{POD_ROOT}/hccl.json",
        "NPU_JOB_TOPOLOGY": f"{POD_ROOT}/topology.yaml",
        "NPU_JOB_K8S_TOPOLOGY": "0",
        "NPU_JOB_WAIT_TIMEOUT": "20",
        "NPU_JOB_POLL_INTERVAL": "0.2",
    }
    return spec_from(
        with_keys(name="llm", nodes=3, scripts_dir=f"{POD_ROOT}/scripts", env=env, **extra)
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "hccl.json").write_text(json.dumps(rank_table(HOSTS)))
    # pods 0 and 2 under tor-b, pod 1 under tor-a: a switch-contiguous order differs from pod order
    (tmp_path / "topology.yaml").write_text(
        'servers:\n  "10.0.0.1": [spine, tor-b]\n  "10.0.0.2": [spine, tor-a]\n  "10.0.0.3": [spine, tor-b]\n'
    )
    return tmp_path


ROOT_ADDR = "llm-worker-0.llm"  # npu-run's parallel rendezvous roots on pod 0, whatever the plan


def expected_from_files(report: Dict[str, Any], index: int) -> Dict[str, str]:
    """What the pod command derives: the rank files when the bootstrap wrote them, else the
    fallback; the master address is pod 0's, where npu-run's root plans the ranks."""
    rank = (report.get("file_RANK_AFTER_ACC") or "").strip() or str(index)
    return {"NODE_RANK": rank, "MASTER_ADDR": ROOT_ADDR}


def assert_consistent_job(reports: List[Dict[str, Any]]) -> None:
    ranks = [int(r["env"]["NODE_RANK"]) for r in reports]
    assert sorted(ranks) == list(range(len(reports))), ranks
    masters = {r["env"]["MASTER_ADDR"] for r in reports}
    assert masters == {ROOT_ADDR}, "every pod must reach the root at pod 0's stable address"


def test_real_bootstrap_then_train_sh_for_three_pods(workspace):
    """The bundled bootstrap plans (pod 1 is alone under tor-a, which sorts first, so it becomes
    node rank 0), the ranks it leaves are exactly what reaches the launcher as its hint, the root
    stays at pod 0's address, and HCCL is pointed at the reordered rank table."""
    reports = run_pods(render(routed_spec()), workspace)
    assert [(r.get("file_RANK_AFTER_ACC") or "").strip() for r in reports] == ["1", "0", "2"]
    for index, report in enumerate(reports):
        assert report["prog"] == "npu-run"
        for key, value in expected_from_files(report, index).items():
            assert report["env"][key] == value, (index, key, report["stderr"])
        assert report["file_MASTER_INDEX"].strip() == "1"  # for launchers rooted on rank 0
        assert report["env"]["RANK_TABLE_FILE"] == "/tmp/jobstart_hccl.reordered.json"
        assert report["argv"][:10] == [
            "--nnodes",
            "3",
            "--nproc_per_node",
            "8",
            "--node_rank",
            report["env"]["NODE_RANK"],
            "--master_addr",
            report["env"]["MASTER_ADDR"],
            "--master_port",
            "29500",
        ]
    assert_consistent_job(reports)


STAND_INS = {
    # pod i -> node rank 2 - i, master = pod 2
    "reversed-order": (
        "echo $((2 - VC_TASK_INDEX)) > /tmp/RANK_AFTER_ACC; echo 2 > /tmp/MASTER_INDEX",
        lambda i: (str(2 - i), "2"),
    ),
    "fails-without-files": ("echo 'bootstrap: cannot plan' >&2; exit 1", lambda i: (str(i), "0")),
    "empty-rank-file": (": > /tmp/RANK_AFTER_ACC", lambda i: (str(i), "0")),
}


@pytest.mark.parametrize("name", list(STAND_INS))
def test_pod_command_takes_ranks_from_the_files_or_falls_back(name, workspace):
    script, expected = STAND_INS[name]
    reports = run_pods(
        render(routed_spec(), bootstrap=f"#!/usr/bin/env bash\n{script}\n"), workspace
    )
    for index, report in enumerate(reports):
        rank, _master = expected(index)
        assert (report["env"]["NODE_RANK"], report["env"]["MASTER_ADDR"]) == (rank, ROOT_ADDR)
        # no npu_job_env.sh was written: HCCL keeps the platform's rank table
        assert report["env"]["RANK_TABLE_FILE"] == f"{POD_ROOT}/hccl.json"
    assert_consistent_job(reports)


def test_routing_off_pods_keep_scheduler_order(workspace):
    reports = run_pods(render(routed_spec(routing=False)), workspace)
    assert [(r["env"]["NODE_RANK"], r["env"]["MASTER_ADDR"]) for r in reports] == [
        (str(i), "llm-worker-0.llm") for i in range(3)
    ]
    assert all("file_RANK_AFTER_ACC" not in r for r in reports)
