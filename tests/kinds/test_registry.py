"""The registry of job kinds: a kind's module is imported when the kind is asked for, and a job's
bundle, which holds its own kind's module alone, answers for another kind with one line."""

from __future__ import annotations

import sys

import pytest
from npu_job.kinds import KINDS, kind_named

from npu_job.errors import InputError


def test_a_kind_whose_module_is_not_in_the_bundle_is_one_input_error(monkeypatch):
    monkeypatch.delitem(sys.modules, "npu_job.kinds.trainjob", raising=False)
    monkeypatch.setitem(sys.modules, "npu_job.kinds.trainjob", None)  # import fails, as there
    assert "trainjob" in KINDS  # a known kind, asked for without importing its module
    with pytest.raises(InputError, match="'trainjob' is not in this bundle"):
        kind_named("trainjob", "environment", "NPU_JOB_KIND")


def test_an_unknown_kind_lists_the_known():
    with pytest.raises(InputError, match="one of ascendjob, indexedjob, .*; got 'nosuch'"):
        kind_named("nosuch", "environment", "NPU_JOB_KIND")
