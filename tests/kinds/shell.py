"""What a kind's bash lines of train.sh do, run in a real bash."""

from __future__ import annotations

import subprocess

from npu_job.kinds.base import JobKind


def master_address(kind: JobKind, **env: str) -> str:
    """``MASTER_ADDR`` as ``kind``'s lines of train.sh (``master_address_bash``) set it, under
    train.sh's ``set -euo pipefail``, with the pod's variables ``env``."""
    script = f'set -euo pipefail\n{kind.master_address_bash()}\nprintf %s "$MASTER_ADDR"'
    return subprocess.run(
        ["bash", "-c", script],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
