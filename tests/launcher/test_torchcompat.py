"""torchcompat's store calls: the same answers on every torch, and none that crashes a process.

torch 2.1 has no Python ``Store.check``, and the ``compare_set`` that could stand in for it
builds its result with the GIL released on 2.1 and 2.2, which crashes a process whose other
Python threads run meanwhile (the agent's proxy loop; seen as segfaults in the matrix's 2.1
rendezvous tests). There :func:`key_exists` uses a connection of npu-run's own; the tests below
run that path on every torch by choosing it, against real stock roots.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from npu_job.launcher import torchcompat

from tests.launcher.proxy_support import tcp_store
from tests.launcher.torch_features import store_errors

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["bindings", "side channel"])
def path(request, monkeypatch):
    """Each test runs once on the path this torch uses and once on the other one (where it can)."""
    side = request.param == "side channel"
    if not side and torchcompat._BINDINGS_NEED_SIDE_CHANNEL:
        pytest.skip("this torch's bindings are the reason for the side channel")
    monkeypatch.setattr(torchcompat, "_BINDINGS_NEED_SIDE_CHANNEL", side)
    return request.param


class NoCompareSet:
    """A client whose ``compare_set`` must not be called (it stands for 2.1's crashing one)."""

    def __init__(self, store) -> None:
        self._store = store
        self.host, self.port, self.timeout = store.host, store.port, store.timeout

    def compare_set(self, *args):
        raise AssertionError("torch's compare_set binding was called")

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_key_exists_sees_the_keys_a_torch_client_wrote(path):
    root = tcp_store(0, master=True)
    client = tcp_store(root.port)
    client.set("written", "x")
    assert torchcompat.key_exists(client, "written")
    assert not torchcompat.key_exists(client, "never written")
    client.delete_key("written")
    assert not torchcompat.key_exists(client, "written")


def test_key_exists_never_calls_torchs_compare_set(path):
    root = tcp_store(0, master=True)
    client = NoCompareSet(tcp_store(root.port))
    client.set("k", "v")
    assert torchcompat.key_exists(client, "k")
    assert not torchcompat.key_exists(client, "absent")


def test_npu_run_calls_no_compare_set_of_any_store():
    """The crash is a race that no single run is sure to show, so the rule is checked in the code:
    no call named ``compare_set`` in the launcher (the proxy relays COMPARE_SET as bytes)."""
    calls = [
        f"{path.name}:{node.lineno}"
        for path in sorted((REPO / "launcher").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "compare_set"
    ]
    assert calls == []


def test_a_gone_root_is_a_store_error_naming_its_address(monkeypatch):
    monkeypatch.setattr(torchcompat, "_BINDINGS_NEED_SIDE_CHANNEL", True)
    root = tcp_store(0, master=True)
    port = root.port
    client = tcp_store(port)
    client.set("k", "v")
    assert torchcompat.key_exists(client, "k")
    del root  # the server goes; the side channel's connection breaks
    with pytest.raises(store_errors(), match=f"127.0.0.1:{port}"):
        torchcompat.key_exists(client, "k")


def test_store_calls_from_several_threads_while_python_runs_do_not_crash_the_process():
    """The crash this module exists for, as it happened: store calls on two threads while other
    Python threads allocate. With key_exists asking through 2.1's compare_set it ended in a
    segfault in about one run of five (a guard, not a proof: see the test above); a child process
    keeps a crash from taking pytest along."""
    script = textwrap.dedent("""
        import sys, threading, time
        from npu_job.launcher import torchcompat
        from tests.launcher.proxy_support import tcp_store
        root = tcp_store(0, master=True)
        stop = time.monotonic() + 3.0
        def calls():
            client = tcp_store(root.port)
            n = 0
            while time.monotonic() < stop:
                client.set(f"k{n % 7}", "v")
                torchcompat.key_exists(client, f"k{n % 5}")
                n += 1
        def churn():
            while time.monotonic() < stop:
                [dict(a=i, b=[i] * 3) for i in range(1000)]
        threads = [threading.Thread(target=calls) for _ in range(3)]
        threads += [threading.Thread(target=churn) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print("ok")
    """)
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
