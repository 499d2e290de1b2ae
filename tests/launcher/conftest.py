"""What the launcher's command-line tests share: an environment without the surrounding shell's
launcher settings."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_launcher_env(monkeypatch, tmp_path):
    """No PET_* or bootstrap variables from the surrounding shell; no real /tmp/RANK_AFTER_ACC."""
    for name in list(os.environ):
        if name.startswith("PET_") or name in ("RANK_AFTER_ACC", "VC_TASK_INDEX", "NPU_JOB_KIND"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NPU_JOB_OUTPUT_DIR", str(tmp_path / "bootstrap-out"))
