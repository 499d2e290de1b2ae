"""The bootstrap of one pod of each registered job kind, from the job's bundle, beside Volcano's.

For each kind of the registry (:data:`npu_job.kinds.KINDS`, whatever it holds) a ``--pods``-pod
job (default 512) is rendered through ``npu-job render``'s own API (``kind: <kind>``,
``routing_source: api``), and the kind's controller makes its pods of the rendered object
(:meth:`~npu_job.kinds.base.JobKind.controller_pods`): their names, hostnames, labels,
annotations and container name. The generated job of ``bench_bootstrap_api.py``
(``tests/bootstrap/kubejob.py``: ~5 KB pods on nodes under HyperNodes) takes those, so the jobs of
two kinds differ only in what the kinds change; each is served by the tests' thin fake of the
Kubernetes API on a real HTTPS server on loopback (every pod in one answer). The middle pod's
environment is what the demo's pod simulator resolves of the rendered container
(``demo/podspec.py``: the controller's variables, its index variable among them, the identity
variables from the pod's labels or annotations, ``NPU_JOB_KIND``, ``NPU_JOB_PODS=k8s``), and
``bash scripts/bootstrap.sh`` runs as that pod does: with the job's bundle ``npu-job.pyz``
(``NPU_JOB_BUNDLE``). Each run is checked to have planned (route plan ``status: success``).

Runs are interleaved (kind A, kind B, ..., repeated) so that the shared machine's noise hits every
kind alike; the table gives medians of wall time and of CPU time (user + sys of the child and its
children, from ``os.wait4``) and each kind's ratio to Volcano's. ``--callgrind`` also counts the
instructions of one run of each kind under ``valgrind --tool=callgrind`` (every process of the
step: bash, the bundle's ``sh`` preamble, python), steady whatever the machine does.

    python benchmarks/bench_bootstrap_kinds.py [--pods 512] [--repeat 7] [--callgrind]
        [--output FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the fake API, the job generator and the demo's simulator

from _report import publish  # noqa: E402
from bench_bootstrap import instructions  # noqa: E402
from bench_bootstrap_api import NAMESPACE, SCRIPT, checked, timed  # noqa: E402
from bench_bundle import _bundle  # noqa: E402
from npu_job.kinds import DEFAULT, KINDS  # noqa: E402

from demo.podspec import pod_specs  # noqa: E402
from demo.scenario import manifest_documents, render_job, rendered_pods  # noqa: E402
from tests.bootstrap.fake_kube_api import (  # noqa: E402
    FakeKubernetesAPI,
    in_cluster,
    service_account,
)
from tests.bootstrap.https_server import HTTPSServer, make_self_signed  # noqa: E402
from tests.bootstrap.kubejob import big_job  # noqa: E402

JOB = "llama"


def kind_values(kind: str, pods: int) -> Dict[str, object]:
    """The job spec of a ``pods``-pod job of ``kind`` routed through the API."""
    values: Dict[str, object] = {
        "name": JOB,
        "namespace": NAMESPACE,
        "kind": kind,
        "image": "registry.example.com/llama:1",
        "script": "/code/train.py",
        "nodes": pods,
        "npus_per_node": 8,
        "routing_source": "api",
        "anti_affinity": True,  # one pod per node, as routing needs
    }
    refused = {key for key, _ in KINDS[kind].refused_keys}
    return {key: value for key, value in values.items() if key not in refused}


def serve_kind(
    stack: ExitStack, directory: Path, kind: str, pods: int, tls: Tuple[Path, Path]
) -> Tuple[HTTPSServer, Dict[str, str]]:
    """A ``pods``-pod job of ``kind`` served by the fake API on a new HTTPS server (closed with
    ``stack``), and the environment of its middle pod's container with the API's address and
    service account and the pod's output folder."""
    rendered = render_job(kind_values(kind, pods))
    nodes, hypernodes, listed = big_job(
        pods, leaves=max(2, pods // 16), namespace=NAMESPACE, controller=rendered_pods(rendered)
    )
    server = stack.enter_context(HTTPSServer(*tls, keep_alive=True))
    FakeKubernetesAPI(
        server,
        "bench-token",
        nodes,
        pods=listed,
        hypernodes=hypernodes,
        namespaces=(NAMESPACE,),
        cached_lists_whole=True,
    )
    host_ips = [pod["status"]["hostIP"] for pod in listed]
    me = pod_specs(manifest_documents(rendered), host_ips, source=kind)[pods // 2]
    account = service_account(directory / f"sa-{kind}", "bench-token", tls[0])
    return server, {
        **me.env_dict(),
        **in_cluster(server, account),
        "NPU_JOB_OUTPUT_DIR": str(directory / f"out-{kind}"),
    }


Row = Tuple[str, float, float, int]  # kind, wall median, CPU median, instructions (0: not counted)


def run(pods: int, repeat: int, callgrind: bool = False) -> Tuple[List[Row], float]:
    """Every registered kind's bootstrap, Volcano's first, ``repeat`` interleaved runs each, and
    the machine's load average as the timed runs began."""
    kinds = [DEFAULT, *sorted(name for name in KINDS if name != DEFAULT)]
    with tempfile.TemporaryDirectory(prefix="bench-bootstrap-kinds-") as tmp, ExitStack() as stack:
        directory = Path(tmp)
        cert, key = make_self_signed(directory)
        bundle = _bundle(directory)
        base = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("NPU_JOB_", "KUBERNETES_", "MA_", "VC_"))
        }
        base.pop("PYTHONDONTWRITEBYTECODE", None)
        base["NPU_JOB_PYTHON"] = sys.executable
        base["NPU_JOB_BUNDLE"] = str(bundle)
        cases: Dict[str, Tuple[HTTPSServer, Dict[str, str]]] = {}
        for kind in kinds:
            server, env = serve_kind(stack, directory, kind, pods, (cert, key))
            cases[kind] = (server, {**base, **env})

        def bootstrap(kind: str) -> Tuple[float, float]:
            server, env = cases[kind]
            wall, cpu, _, _ = checked(partial(timed, ["bash", str(SCRIPT)], env, server), env)
            return wall, cpu

        for kind in kinds:  # warm the page cache and check each plans
            bootstrap(kind)
        samples: Dict[str, List[Tuple[float, float]]] = {kind: [] for kind in kinds}
        load = os.getloadavg()[0]
        for _ in range(repeat):
            for kind in kinds:
                samples[kind].append(bootstrap(kind))
        counted: Dict[str, int] = {}
        if callgrind:
            for kind in kinds:
                env = cases[kind][1]
                command = ["bash", str(SCRIPT)]
                counted[kind] = checked(
                    partial(instructions, command, env, every_process=True), env
                )
    median = statistics.median
    rows = [
        (
            kind,
            median(wall for wall, _ in samples[kind]),
            median(cpu for _, cpu in samples[kind]),
            counted.get(kind, 0),
        )
        for kind in kinds
    ]
    return rows, load


def table_text(rows: Sequence[Row], pods: int, repeat: int, load: float) -> str:
    _, base_wall, base_cpu, base_count = rows[0]
    lines = [
        f"# the bootstrap from the bundle, one pod of a {pods}-pod job of each kind, pods from the",
        f"# Kubernetes API (fake, on loopback); medians of {repeat} interleaved runs each (python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end)",
        "",
        "| kind | wall s | CPU s | wall vs volcano | CPU vs volcano | instructions (vs volcano) |",
        "|---|---|---|---|---|---|",
    ]
    for kind, wall, cpu, count in rows:
        counted = f"{count / 1e6:.0f} M ({count / base_count:.3f})" if count else "-"
        lines.append(
            f"| {kind} | {wall:.3f} | {cpu:.3f} | {wall / base_wall:.2f} | {cpu / base_cpu:.2f} "
            f"| {counted} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=512, help="pods of each kind's job")
    parser.add_argument("--repeat", type=int, default=7, help="interleaved repetitions per kind")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions")
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args(list(argv) or None)
    if args.callgrind and shutil.which("valgrind") is None:
        parser.error("--callgrind needs valgrind (apt-get install valgrind)")
    rows, load = run(args.pods, args.repeat, args.callgrind)
    publish(table_text(rows, args.pods, args.repeat, load), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
