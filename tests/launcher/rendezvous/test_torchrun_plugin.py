"""Plain ``torchrun`` can use the ``parallel`` backend: npu-job registers it in torch's
``torchrun.handlers`` entry-point group, so a job that keeps torchrun still gets ranks in the
bootstrap's order from a static-membership rendezvous."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from npu_job.launcher import torchcompat

from tests.launcher.cluster import free_port
from tests.launcher.torch_features import needs

# torch's registry loads torchrun.handlers entry points only after 2.4; npu-run needs none
pytestmark = needs("torchrun.handlers")

WORKER = Path(__file__).parent.parent / "workers" / "record_env.py"


def torchrun(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    beside = Path(sys.executable).with_name("torchrun")  # this interpreter's torch, not PATH's
    command = str(beside) if beside.exists() else shutil.which("torchrun")
    if command is None:
        pytest.skip("torch's torchrun script is not on PATH")
    argv = [
        command,
        "--nnodes=1",
        "--nproc_per_node=2",
        "--rdzv_backend=parallel",
        f"--rdzv_endpoint=127.0.0.1:{free_port()}",
        *extra,
        str(WORKER),
        str(tmp_path),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_plain_torchrun_launches_workers_through_the_parallel_backend(tmp_path):
    result = torchrun(tmp_path, "--rdzv_conf", "rank=0")
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert [r["RANK"] for r in records] == ["0", "1"]
    uses_agent_store = str(torchcompat.HAS_LIST_KEYS)  # else global rank 0 hosts (torchcompat)
    assert all(
        r["sum"] == 3.0 and r["TORCHELASTIC_USE_AGENT_STORE"] == uses_agent_store for r in records
    )


def test_plain_torchrun_without_a_rank_is_told_how_to_pass_it(tmp_path):
    result = torchrun(tmp_path)
    assert result.returncode != 0
    assert "--rdzv_conf rank=N" in result.stderr
    assert not list(tmp_path.glob("*.json"))
