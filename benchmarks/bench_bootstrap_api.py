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

Target: 4096 pods within 0.15 s of bare interpreter start for the work once the API answers: the
median CPU excess, and the wall excess less the API's time, both printed with a verdict.

Each size also times the least pod reader (``_least_pod_reader.py``), interleaved with the rest:
a script that reads the same pods from the same API and does nothing else, with the standard
library's TLS and HTTP and msgspec, as the bootstrap reads them. Its excess is the floor under any
Python pod that reads its job from the API, and the table says how much of the budget it leaves.

``--callgrind``: also count the instructions of one bare start, one least pod reader and one
run of the biggest size under ``valgrind --tool=callgrind`` (following bash's exec into python): a
steady figure where a busy machine makes CPU times wander by tens of milliseconds. One more run,
cut into phases by ``_bootstrap_phases.py`` (start-up and imports, reading the pods, the roster,
the topology, the plan, the files, the rest), says where the bootstrap's instructions go, and one
more least pod reader, cut into its own phases (start-up and imports, TLS and HTTP, inflating,
decoding), where the floor's go.

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
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the fake API and the job generator live with the tests

from _hidden import hidden  # noqa: E402
from _phase_marks import ENV as LEAST_PHASES_ENV  # noqa: E402
from _phase_marks import MARK as PHASE_MARK  # noqa: E402
from _report import publish  # noqa: E402

from tests.bootstrap.fake_kube_api import (  # noqa: E402
    FakeKubernetesAPI,
    in_cluster,
    service_account,
)
from tests.bootstrap.https_server import HTTPSServer, make_self_signed  # noqa: E402
from tests.bootstrap.kubejob import big_job  # noqa: E402

SCRIPT = REPO / "scripts" / "bootstrap.sh"
LEAST_READER = Path(__file__).resolve().parent / "_least_pod_reader.py"
PHASES = Path(__file__).resolve().parent / "_bootstrap_phases.py"
BARE, BOOTSTRAP, LEAST = "python -c pass", "bash bootstrap.sh", "least pod reader"
WITHOUT_ZLIB_NG = "  without zlib-ng"
TARGET_EXCESS = 0.15
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


def instructions(command: Sequence[str], env: Dict[str, str]) -> int:
    """Instructions the command's last process image ran (callgrind's ``I refs``)."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--trace-children=yes", "--callgrind-out-file=/dev/null"]
        + list(command),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    counts = [line.split()[-1] for line in done.stderr.splitlines() if "I   refs:" in line]
    return int(counts[-1].replace(",", ""))


def phase_instructions(script: Path, env: Dict[str, str]) -> List[Tuple[str, int]]:
    """Instructions of each phase of one run of ``script`` (``_bootstrap_phases.py``, or the
    least pod reader with its phases asked for), in the order the phases first ran; a phase
    entered several times is summed."""
    with tempfile.TemporaryDirectory(prefix="bench-phases-") as out:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--dump-before={PHASE_MARK}",
                f"--callgrind-out-file={out}/cg",
                sys.executable,
                str(script),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        names = done.stdout.splitlines()
        # cg.1, cg.2, ... at each boundary, then cg for what ran after the last one
        profiles = sorted(
            Path(out).glob("cg*"), key=lambda path: int(path.suffix[1:] or sys.maxsize)
        )
        if len(profiles) != len(names):
            raise SystemExit(
                f"{script.name}: {len(profiles)} callgrind profiles for {len(names)} phases "
                f"(does what it runs call {PHASE_MARK} itself now?)"
            )
        totals: Dict[str, int] = {}
        for name, profile in zip(names, profiles):
            totals[name] = totals.get(name, 0) + _profile_total(profile)
    return list(totals.items())


def _profile_total(profile: Path) -> int:
    with profile.open() as lines:
        for line in lines:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit(f"{profile}: no instruction total")


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


class Counted(NamedTuple):
    """Instructions (callgrind) of one run each, at the biggest size."""

    bare: int
    least: int
    bootstrap: int
    phases: List[Tuple[str, int]]  # one more bootstrap run, by phase
    least_phases: List[Tuple[str, int]]  # one more least pod reader's run, by phase


def run(
    sizes: Sequence[int], repeat: int, callgrind: bool = False, whole: bool = True
) -> Tuple[List[Row], Optional[Counted]]:
    """One HTTPS server (and fake API) per size, all up at once; runs interleaved. With
    ``callgrind``, also the instructions of a bare start, the least pod reader and the bootstrap
    at the biggest size, and the bootstrap's by phase."""
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
            nodes, hypernodes, pods = big_job(size, leaves=max(2, size // 16))
            server = stack.enter_context(HTTPSServer(cert, key, keep_alive=True))
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
            account = service_account(Path(tmp) / f"sa{size}", "bench-token", cert)
            cases[size] = (
                server,
                {
                    **base,
                    **in_cluster(server, account),
                    "NPU_JOB_PODS": "k8s",
                    "MA_VJ_NAME": "llama",
                    "MA_NUM_HOSTS": str(size),
                    "MA_CURRENT_HOST_IP": me["status"]["hostIP"],
                    "VC_TASK_INDEX": me["metadata"]["labels"]["volcano.sh/task-index"],
                    "NPU_JOB_OUTPUT_DIR": str(Path(tmp) / f"out{size}"),
                },
            )

        no_zlib_ng = {  # as an image without zlib-ng: the standard library inflates
            size: hidden("zlib_ng", Path(tmp) / "no-zlib_ng", env)
            for size, (_, env) in cases.items()
        }

        def bootstrap(
            server: HTTPSServer, env: Dict[str, str]
        ) -> Tuple[float, float, float, float]:
            result = timed(["bash", str(SCRIPT)], env, server)
            check_success(env)
            return result

        def once(size: int) -> Tuple[float, float, float, float]:
            return bootstrap(*cases[size])

        def without_zlib_ng(size: int) -> Tuple[float, float, float, float]:
            return bootstrap(cases[size][0], no_zlib_ng[size])

        def least(size: int) -> Tuple[float, float, float, float]:
            server, env = cases[size]
            return timed([sys.executable, str(LEAST_READER)], env, server)

        for size in sizes:  # warm the page cache and the bytecode, and check it works
            once(size)
            without_zlib_ng(size)
            least(size)
        idle = cases[sizes[0]][0]
        samples: Dict[Tuple[str, int], List[Tuple[float, float, float, float]]] = {
            (BARE, 0): [],
            **{(kind, s): [] for s in sizes for kind in (BOOTSTRAP, WITHOUT_ZLIB_NG, LEAST)},
        }
        for _ in range(repeat):
            samples[BARE, 0].append(timed([sys.executable, "-c", "pass"], base, idle))
            for size in sizes:
                samples[BOOTSTRAP, size].append(once(size))
                samples[WITHOUT_ZLIB_NG, size].append(without_zlib_ng(size))
                samples[LEAST, size].append(least(size))
        counted = None
        if callgrind:
            env = cases[sizes[-1]][1]
            counted = Counted(
                instructions([sys.executable, "-c", "pass"], base),
                instructions([sys.executable, str(LEAST_READER)], env),
                checked(lambda: instructions(["bash", str(SCRIPT)], env), env),
                checked(lambda: phase_instructions(PHASES, env), env),
                phase_instructions(LEAST_READER, {**env, LEAST_PHASES_ENV: "1"}),
            )
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
        f"average {os.getloadavg()[0]:.1f}); target: 4096 pods within {TARGET_EXCESS:.2f} s of "
        "bare start-up once the API answers",
        "",
        f"{'command':<18} {'pods':>5} {'wall med':>9} {'api med':>8} {'wall-api':>9} "
        f"{'cpu med':>8} {'wall-api excess':>16} {'cpu excess':>11} {'after last answer':>18}",
    ]
    for name, size, wall, cpu, api, rest, after in rows:
        lines.append(
            f"{name:<18} {size or '-':>5} {wall:>9.3f} {api:>8.3f} {rest:>9.3f} "
            f"{cpu:>8.3f} {rest - base[5]:>16.3f} {cpu - base[3]:>11.3f} {after:>18.3f}"
        )
    biggest = next(row for row in reversed(rows) if row[0] == BOOTSTRAP)
    floor = next(row for row in reversed(rows) if row[0] == LEAST)
    zlib_only = next(row for row in reversed(rows) if row[0] == WITHOUT_ZLIB_NG)
    lines += [
        "",
        f"target ({biggest[1]} pods within {TARGET_EXCESS:.2f} s of bare start-up, once the API "
        "answers):",
        f"  cpu:  median excess {biggest[3] - base[3]:.3f} s (user+sys of the pod): "
        f"{_verdict(biggest[3] - base[3])}",
        f"  wall: median excess less the API's answering time {biggest[5] - base[5]:.3f} s: "
        f"{_verdict(biggest[5] - base[5])}",
        f"  without zlib-ng (the standard library's zlib inflates): cpu excess "
        f"{zlib_only[3] - base[3]:.3f} s; zlib-ng/zlib cpu excess ratio "
        f"{(biggest[3] - base[3]) / (zlib_only[3] - base[3]):.2f}",
        f"  after the last answer: median {biggest[6]:.3f} s from the API's last byte to the "
        f"pod's exit (decode of that page, topology, plan, files): {_verdict(biggest[6])}",
        f"  floor: reading the {floor[1]} pods and nothing else (the least pod reader: TLS, "
        f"HTTP, inflate, msgspec into the nine fields) costs {floor[3] - base[3]:.3f} s of CPU "
        f"over bare start-up, which leaves {TARGET_EXCESS - (floor[3] - base[3]):.3f} s of the "
        "budget for the roster, the topology, the plan and the files",
    ]
    if counted is not None:
        lines += ["", *_instruction_lines(counted, biggest[1])]
    return "\n".join(lines) + "\n"


def _instruction_lines(counted: Counted, pods: int) -> List[str]:
    bare = counted.bare
    return [
        f"instructions (callgrind, one run each) at {pods} pods: python -c pass {bare:,}; "
        f"least pod reader {counted.least:,} (excess {counted.least - bare:,}); bootstrap.sh "
        f"{counted.bootstrap:,} (excess {counted.bootstrap - bare:,}, of which "
        f"{counted.bootstrap - counted.least:,} beyond the least reader's)",
        f"the bootstrap by phase ({PHASES.name}, python without bash; M = millions):",
        *_phase_lines(counted.phases, bare),
        f"the least pod reader by phase ({LEAST_READER.name}, {LEAST_PHASES_ENV}=1):",
        *_phase_lines(counted.least_phases, bare),
    ]


def _phase_lines(phases: Sequence[Tuple[str, int]], bare: int) -> List[str]:
    total = sum(count for _, count in phases)
    lines = []
    for name, count in phases:
        shown = f"{count / 1e6:10.1f} M  {count / total:6.1%}"
        if name == "start-up and imports":
            shown += f"  (a bare start-up is {bare / 1e6:.1f} M of it)"
        lines.append(f"  {name:<22} {shown}")
    lines.append(f"  {'total':<22} {total / 1e6:10.1f} M")
    return lines


def _verdict(excess: float) -> str:
    return "met" if excess <= TARGET_EXCESS else f"NOT met (over by {excess - TARGET_EXCESS:.3f} s)"


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
