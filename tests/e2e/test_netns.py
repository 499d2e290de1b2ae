"""The multi-host harness itself: hosts reach each other by pod DNS name, /tmp is per host, and
nothing is left behind. (The pipeline's end-to-end cases build on this.)"""

import subprocess
import sys

import pytest

from tests.e2e.netns import NetnsCluster, leftovers, netns_unavailable_reason

REASON = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

SERVER = """
import socket, sys
s = socket.socket(); s.bind(("0.0.0.0", 29555)); s.listen(1)
print("ready", flush=True)
c, addr = s.accept(); c.sendall(addr[0].encode()); c.close()
"""
CLIENT = """
import socket, time
for _ in range(100):
    try:
        c = socket.create_connection(("job-worker-0.job", 29555), timeout=2); break
    except OSError:
        time.sleep(0.05)
print(c.recv(100).decode())
"""


def test_hosts_talk_by_pod_name_have_private_tmp_and_leave_nothing_behind():
    with NetnsCluster(
        2, hostnames={"job-worker-0.job": 0, "job-worker-1.job": 1}, tag="t1"
    ) as cluster:
        server = cluster.popen(0, [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "ready"
        client = cluster.popen(1, [sys.executable, "-c", CLIENT], stdout=subprocess.PIPE, text=True)
        out, _ = client.communicate(timeout=30)
        assert out.strip() == cluster.hosts[1].ip  # the server saw the client's own host address
        for host in cluster.hosts:
            cluster.popen(host.index, ["sh", "-c", f"echo {host.index} > /tmp/mine"]).wait(
                timeout=10
            )
        assert [(h.tmp_dir / "mine").read_text().strip() for h in cluster.hosts] == ["0", "1"]
        sleeper = cluster.popen(0, ["sleep", "600"])
    assert sleeper.poll() is not None
    assert leftovers("t1") == []
