"""The optional accelerator (msgspec): not even tried for small inputs, loaded by the first
big one, then serving every input; an image without it gets None, and the caller's standard
library path."""

from __future__ import annotations

import sys

import pytest
from npu_job.bootstrap.base.accelerator import MSGSPEC, Accelerator

BOTH = pytest.mark.parametrize("accelerator", [MSGSPEC], ids=["msgspec"])


@BOTH
def test_small_inputs_do_not_load_it_and_the_first_big_one_does(monkeypatch, accelerator):
    monkeypatch.setattr(accelerator, "module", False)
    assert accelerator.for_size(accelerator.from_bytes - 1) is None
    assert accelerator.module is False  # not even tried
    loaded = accelerator.for_size(accelerator.from_bytes)
    assert loaded is sys.modules[accelerator.name]
    # loaded, it serves small inputs too: the last page of a big LIST, a small list after it
    assert accelerator.for_size(1) is loaded


def test_msgspec_comes_with_its_json_codec(monkeypatch):
    monkeypatch.setattr(MSGSPEC, "module", False)
    assert MSGSPEC.for_size(MSGSPEC.from_bytes).json.decode(b"[1]") == [1]


@BOTH
def test_an_image_without_it_gets_none_and_is_asked_once(monkeypatch, accelerator):
    monkeypatch.setattr(accelerator, "module", False)
    top = accelerator.name.split(".")[0]
    monkeypatch.setitem(sys.modules, top, None)  # what an image without it looks like
    assert accelerator.for_size(10**9) is None
    assert accelerator.module is None
    monkeypatch.delitem(sys.modules, top)  # installed since: the answer stays (no retry per input)
    assert accelerator.for_size(10**9) is None


def test_a_module_that_is_not_there_is_not_an_error():
    absent = Accelerator("npu_job_no_such_accelerator", from_bytes=0)
    assert absent.for_size(0) is None
