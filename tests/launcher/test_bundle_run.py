"""npu-run from the job's bundle on a stock torch: nothing of npu-job installed, only the file.

A training image has python3 and torch; the pod runs ``sh npu-job.pyz run ...`` with
``NPU_JOB_PYTHON`` naming that python3. Here that python is a venv that sees this interpreter's
packages but not npu-job's, neither its modules nor its metadata (:mod:`.stock_python`), so no
``torchrun.handlers`` entry point exists there. On it, from the bundle alone:

* two nodes of two workers each join one gloo process group through the ``parallel`` rendezvous
  and the tiered store, and each node's first line names the bundle it runs;
* a worker that fails on its first attempt is restarted (``--max_restarts 1``) and the job ends
  well;
* the ``parallel`` backend is registered by npu-run itself;
* and on a python3 without torch, npu-run is one ``npu-run: error:`` line, exit 9.

Real processes on loopback, as in :mod:`.test_multinode` (whose cluster helper runs the nodes).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterator, List, NamedTuple, Sequence

import pytest

from npu_job.bundle import BUNDLE_NAME, Bundle, installed_bundle
from npu_job.errors import MissingExtraError
from tests.machine_stalls import run

from .cluster import LocalCluster
from .stock_python import clean_env, make_bare_python, make_stock_python

NNODES = 2
NPROC = 2
WORLD = NNODES * NPROC
# seconds for a whole job at an idle machine's pace (tests.machine_stalls.Cap); each takes under 10
# on an idle 2-core machine
TIMEOUT = 60


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return installed_bundle()


class Pod(NamedTuple):
    """What a pod has: a directory outside the repository, the image's python3, the bundle."""

    dir: Path
    python: Path
    bundle: Path


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, bundle: Bundle) -> Pod:
    directory = tmp_path_factory.mktemp("pod")
    bundle_path = directory / BUNDLE_NAME
    bundle_path.write_bytes(bundle.data)
    return Pod(directory, make_stock_python(directory), bundle_path)


@pytest.fixture
def cluster(tmp_path: Path, pod: Pod) -> Iterator[LocalCluster]:
    made = LocalCluster(
        tmp_path,
        nnodes=NNODES,
        nproc_per_node=NPROC,
        launcher=("sh", str(pod.bundle), "run"),
        cwd=pod.dir,
    )
    yield made
    made.kill_all()


def start_job(
    cluster: LocalCluster,
    pod: Pod,
    out: Path,
    launcher_args: Sequence[str] = (),
    worker_args: Sequence[str] = (),
) -> None:
    """Both nodes, tiered, ``workers/record_env.py`` writing to ``out``."""
    # PYTHONPATH empty counts as unset: nothing leads the stock python back to this one's packages
    env = {"NPU_JOB_PYTHON": str(pod.python), "PYTHONPATH": ""}
    for node_rank in range(NNODES):
        cluster.start(
            str(node_rank),
            "record_env.py",
            [str(out), *worker_args],
            launcher_args=["--enable_tiered_parallel_tcpstore=true", *launcher_args],
            env=env,
        )


def records(out: Path) -> List[dict]:
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(WORLD)]


def test_two_tiered_nodes_train_from_the_bundle_on_a_stock_torch(cluster, pod, bundle, tmp_path):
    out = tmp_path / "records"
    out.mkdir()
    start_job(cluster, pod, out)
    assert cluster.wait_all(TIMEOUT) == [0] * NNODES, cluster.logs()

    found = records(out)
    assert [r["pg_rank"] for r in found] == list(range(WORLD))
    assert {r["pg_world_size"] for r in found} == {WORLD}
    assert {r["sum"] for r in found} == {float(sum(range(1, WORLD + 1)))}  # one all_reduce
    # node rank 1's workers share one store that is not the root: its proxy
    node_1_ports = {r["MASTER_PORT"] for r in found[NPROC:]}
    assert len(node_1_ports) == 1 and node_1_ports != {str(cluster.master_port)}
    for node in cluster.nodes:
        log = node.log()
        assert f"running {bundle.version} from bundle {bundle.short_digest} ({pod.bundle})" in (log)
        assert f"({pod.python})" in log.splitlines()[0]  # on the image's python, not ours
        assert "(this node's proxy)" in log  # npu-run's own line on every torch of the matrix


def test_a_worker_failing_once_is_restarted_from_the_bundle(cluster, pod, tmp_path):
    """Global rank 3 raises while TORCHELASTIC_RESTART_COUNT is 0 (before joining the group):
    its node restarts its workers, the other node restarts its own with them (without spending a
    restart of its own, as under torch's c10d backend), and every worker of round 1 succeeds."""
    out = tmp_path / "records"
    out.mkdir()
    start_job(cluster, pod, out, ["--max_restarts=1"], ["--fail-rank", "3"])
    assert cluster.wait_all(TIMEOUT) == [0] * NNODES, cluster.logs()

    found = records(out)
    assert [r["TORCHELASTIC_RESTART_COUNT"] for r in found] == ["0", "0", "1", "1"]
    assert {r["sum"] for r in found} == {float(sum(range(1, WORLD + 1)))}
    assert "worker rank 3 fails on purpose before restart 1" in cluster.logs()
    assert all("round 1 complete" in node.log() for node in cluster.nodes)


# npu-run's own registration, in the stock python with the bundle first on sys.path, as it runs
_REGISTRY = """\
import sys
sys.path.insert(0, sys.argv[1])
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

params = RendezvousParameters("parallel", "127.0.0.1:29500", "job", 1, 1, rank=0)
try:
    rendezvous_handler_registry.create_handler(params)
    sys.exit("parallel was registered before npu-run registered it: an entry point is visible")
except ValueError:
    pass
from npu_job.launcher.rendezvous import handler as backend

backend.register()
handler = rendezvous_handler_registry.create_handler(params)
print(type(handler).__module__, handler.get_backend(), backend.__file__)
"""


def test_npu_run_registers_the_parallel_backend_without_entry_points(pod):
    done = run(
        [str(pod.python), "-c", _REGISTRY, str(pod.bundle)], TIMEOUT, cwd=pod.dir, env=clean_env()
    )
    assert done.returncode == 0, done.stderr
    module, backend, source = done.stdout.split()
    assert (module, backend) == ("npu_job.launcher.rendezvous.handler", "parallel")
    assert source.startswith(str(pod.bundle))


def test_without_torch_npu_run_is_one_line_exit_9_and_version_still_works(tmp_path, pod, bundle):
    python = make_bare_python(tmp_path)
    env = {**clean_env(), "NPU_JOB_PYTHON": str(python)}

    def bundle_run(*argv: str) -> subprocess.CompletedProcess:
        return run(["sh", str(pod.bundle), *argv], TIMEOUT, cwd=tmp_path, env=env)

    assert bundle_run("version").stdout == f"npu-job {bundle.version} {bundle.digest}\n"
    for argv in (["run", "--help"], ["run", "--nnodes=1", "train.py"]):
        done = bundle_run(*argv)
        assert done.returncode == MissingExtraError.exit_code, done.stderr
        identity, error = done.stderr.splitlines()  # what runs, then why it cannot
        assert identity.startswith(f"npu-job: running {bundle.version} from bundle")
        assert error.startswith("npu-run: error: npu-run needs torch, which Python "), error
        assert f"({python}) cannot import (No module named 'torch')" in error
        assert "(train.sh: NPU_JOB_LAUNCHER_PYTHON)" in error
