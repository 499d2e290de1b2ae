"""The bootstrap of a job with no rank table: its pods, Nodes and HyperNodes from the API.

For each size (default 64, 1024 and 4096 pods) a Volcano job is generated
(``tests/bootstrap/kubejob.py``: every pod a ~5 KB copy of a real-looking pod, the nodes under
HyperNodes of 16 nodes, 16 of those per spine) and served by the tests' thin fake of the
Kubernetes LIST endpoints (``tests/bootstrap/fake_kube_api.py``) on a real HTTPS server on
loopback, in this process, gzipped as the API server gzips big answers. ``--api whole`` (the
default) answers the first request (``resourceVersion=0``) with every pod at once, as API servers
before Kubernetes 1.34 do from their watch cache, which ignores ``limit``; ``--api pages`` cuts
pages of 500 with ``limit``/``continue``, as 1.34 and later do. ``bash scripts/bootstrap.sh`` runs as one pod of the job (``NPU_JOB_PODS=k8s``)
end to end: list the pods (all scheduled), the HyperNodes and the Nodes, decode, resolve the tree,
plan, write. Each run is checked to have succeeded (route plan ``status: success``).

Timing, interleaved with a bare ``python3 -c pass`` as in ``bench_bootstrap.py``:

* wall time, and wall time less the time the fake API server spent answering that run (its
  handler's span from request to answer sent: the pod waiting for the API);
* CPU time of the child (user + sys from ``os.wait4``), which never counts the server's work;
* wall time from the API's last answer to the pod's exit: the work left once the API has answered
  (decoding that page, the topology, the plan, the files).

Each size also runs with msgspec hidden (the standard library's path), side by side: the pod-side
target is that the bootstrap gets no slower than that path was. ``--callgrind``: also
count the instructions of one bare start and one run of each case at the biggest size under
``valgrind --tool=callgrind`` (following bash's exec into python).

    python benchmarks/bench_bootstrap_api.py [--sizes 64,1024,4096] [--repeat 7] [--callgrind]
        [--api whole|pages] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the fake API and the job generator live with the tests

from _hidden import hidden  # noqa: E402
from _report import publish  # noqa: E402
from bench_bootstrap import (  # noqa: E402
    BARE,
    CASES,
    WITH_MSGSPEC,
    WITHOUT_MSGSPEC,
    Counted,
    instruction_lines,
    instructions,
)

from tests.bootstrap.fake_kube_api import (  # noqa: E402
    FakeKubernetesAPI,
    in_cluster,
    service_account,
)
from tests.bootstrap.https_server import HTTPSServer, make_self_signed  # noqa: E402
from tests.bootstrap.kubejob import big_job  # noqa: E402

SCRIPT = REPO / "scripts" / "bootstrap.sh"
NAMESPACE = "team-a"


def timed(
    command: Sequence[str], env: Dict[str, str], server: HTTPSServer
) -> Tuple[float, float, float, float]:
    """(wall, CPU user+sys, API time, wall after the API's last answer) of one run."""
    before = len(server.busy)
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        end = time.perf_counter()
        if os.waitstatus_to_exitcode(status) != 0:
            errors.seek(0)
            raise SystemExit(
                f"{' '.join(command)} failed: {errors.read().decode(errors='replace')}"
            )
    spans = server.busy[before:]
    api = sum(stop - begin for begin, stop in spans)
    after = end - max((stop for _, stop in spans), default=start)
    return end - start, usage.ru_utime + usage.ru_stime, api, after


def check_success(env: Dict[str, str]) -> None:
    plan = json.loads((Path(env["NPU_JOB_OUTPUT_DIR"]) / "route_plan.json").read_text())
    if plan["status"] != "success":
        raise SystemExit(f"bootstrap did not plan: {plan['reason']}")


T = TypeVar("T")


def checked(measure: Callable[[], T], env: Dict[str, str]) -> T:
    """``measure()``, a run of the bootstrap, checked to have planned: a run that fell back to the
    scheduler order (the API too slow under valgrind, say) would count a different program."""
    (Path(env["NPU_JOB_OUTPUT_DIR"]) / "route_plan.json").unlink(missing_ok=True)
    result = measure()
    check_success(env)
    return result


Row = Tuple[str, int, float, float, float, float, float]


def serve_job(
    stack: ExitStack, directory: Path, size: int, tls: Tuple[Path, Path], *, whole: bool = True
) -> Tuple[HTTPSServer, Dict[str, str]]:
    """A ``size``-pod job (:func:`big_job`) served by the fake API on a new HTTPS server (closed
    with ``stack``; ``whole``: the first list in one answer), and the environment its middle pod
    adds: the API's address and service account, the job, this pod, its output folder."""
    nodes, hypernodes, pods = big_job(size, leaves=max(2, size // 16))
    server = stack.enter_context(HTTPSServer(*tls, keep_alive=True))
    FakeKubernetesAPI(
        server,
        "bench-token",
        nodes,
        pods=pods,
        hypernodes=hypernodes,
        namespaces=(NAMESPACE,),
        cached_lists_whole=whole,
    )
    me = pods[size // 2]
    account = service_account(directory / f"sa{size}", "bench-token", tls[0])
    return server, {
        **in_cluster(server, account),
        "NPU_JOB_PODS": "k8s",
        "MA_VJ_NAME": "llama",
        "MA_NUM_HOSTS": str(size),
        "MA_CURRENT_HOST_IP": me["status"]["hostIP"],
        "VC_TASK_INDEX": me["metadata"]["labels"]["volcano.sh/task-index"],
        "NPU_JOB_OUTPUT_DIR": str(directory / f"out{size}"),
    }


def run(
    sizes: Sequence[int], repeat: int, callgrind: bool = False, whole: bool = True
) -> Tuple[List[Row], Counted]:
    """One HTTPS server (and fake API) per size, all up at once; runs interleaved. With
    ``callgrind``, also the instructions of a bare start and of each case at the biggest size."""
    with tempfile.TemporaryDirectory(prefix="bench-bootstrap-api-") as tmp, ExitStack() as stack:
        cert, key = make_self_signed(Path(tmp))
        base = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("NPU_JOB_", "KUBERNETES_", "MA_", "VC_"))
        }
        base.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached
        base["NPU_JOB_PYTHON"] = sys.executable  # bootstrap.sh runs this interpreter's npu_job
        cases: Dict[int, Tuple[HTTPSServer, Dict[str, str]]] = {}
        for size in sizes:
            server, env = serve_job(stack, Path(tmp), size, (cert, key), whole=whole)
            cases[size] = (server, {**base, **env})

        envs = {
            (case, size): env if case == WITH_MSGSPEC else hidden("msgspec", Path(tmp) / "nm", env)
            for size, (_, env) in cases.items()
            for case in CASES
        }

        def bootstrap(case: str, size: int) -> Tuple[float, float, float, float]:
            env = envs[case, size]
            result = timed(["bash", str(SCRIPT)], env, cases[size][0])
            check_success(env)
            return result

        for size in sizes:  # warm the page cache and the bytecode, and check it works
            for case in CASES:
                bootstrap(case, size)
        idle = cases[sizes[0]][0]
        samples: Dict[Tuple[str, int], List[Tuple[float, float, float, float]]] = {
            (BARE, 0): [],
            **{(case, s): [] for s in sizes for case in CASES},
        }
        for _ in range(repeat):
            samples[BARE, 0].append(timed([sys.executable, "-c", "pass"], base, idle))
            for size in sizes:
                for case in CASES:
                    samples[case, size].append(bootstrap(case, size))
        counted: Counted = {}
        if callgrind:
            counted[BARE] = instructions([sys.executable, "-c", "pass"], base)
            for case in CASES:
                env = envs[case, sizes[-1]]
                counted[case] = checked(partial(instructions, ["bash", str(SCRIPT)], env), env)
    median = statistics.median
    rows: List[Row] = []
    for kind, size in samples:
        wall, cpu, api, after = zip(*samples[kind, size])
        rows.append(
            (
                kind,
                size,
                median(wall),
                median(cpu),
                median(api),
                median(w - a for w, _, a, _ in samples[kind, size]),
                median(after) if size else 0.0,
            )
        )
    return rows, counted


def table_text(
    rows: Sequence[Row], repeat: int, counted: Optional[Counted] = None, whole: bool = True
) -> str:
    base = rows[0]
    answers = "all pods in one answer" if whole else "pages of 500"
    lines = [
        f"bootstrap with no rank table, pods from the Kubernetes API (fake, on loopback, "
        f"{answers}), {repeat} "
        f"interleaved runs each (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load "
        f"average {os.getloadavg()[0]:.1f})",
        "",
        f"{'command':<18} {'pods':>5} {'wall med':>9} {'api med':>8} {'wall-api':>9} "
        f"{'cpu med':>8} {'wall-api excess':>16} {'cpu excess':>11} {'after last answer':>18}",
    ]
    for name, size, wall, cpu, api, rest, after in rows:
        lines.append(
            f"{name:<18} {size or '-':>5} {wall:>9.3f} {api:>8.3f} {rest:>9.3f} "
            f"{cpu:>8.3f} {rest - base[5]:>16.3f} {cpu - base[3]:>11.3f} {after:>18.3f}"
        )
    shipped = next(row for row in reversed(rows) if row[0] == WITH_MSGSPEC)
    stdlib = next(row for row in reversed(rows) if row[0] == WITHOUT_MSGSPEC)
    lines += [
        "",
        f"{shipped[1]} pods, with msgspec against the standard library's path (msgspec hidden), "
        f"once the API answers: cpu excess {shipped[3] - base[3]:.3f} against "
        f"{stdlib[3] - base[3]:.3f} s, wall excess less the API's time {shipped[5] - base[5]:.3f} "
        f"against {stdlib[5] - base[5]:.3f} s, after the last answer {shipped[6]:.3f} against "
        f"{stdlib[6]:.3f} s",
    ]
    if counted:
        lines += ["", *instruction_lines(counted, f"{shipped[1]} pods")]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,1024,4096", help="comma-separated pod counts")
    parser.add_argument("--repeat", type=int, default=7, help="interleaved repetitions per case")
    parser.add_argument(
        "--callgrind", action="store_true", help="also count instructions (valgrind)"
    )
    parser.add_argument(
        "--api",
        choices=("whole", "pages"),
        default="whole",
        help="how the API answers the first list (resourceVersion=0): whole, from the watch "
        "cache of servers before Kubernetes 1.34 (default), or in pages of 500 (1.34 and later)",
    )
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args(list(argv) or None)
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    whole = args.api == "whole"
    rows, counted = run(sizes, args.repeat, args.callgrind, whole)
    publish(table_text(rows, args.repeat, counted, whole), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
