"""Does the routing-affine order make real collectives faster? Measured on an emulated fabric.

Every node is a network namespace on this machine, every switch a Linux bridge, every link a
veth pair shaped with ``tc`` (``--rate`` Mbit/s, low enough that the links and not the two CPUs
set the pace). For each shape (``--shapes``: ``12x4`` = 12 nodes under 4 ToRs, ``16:6,4,4,2`` =
uneven ToRs, ``16x4/2@2`` = a spine tier of 2 groups with 2:1 oversubscribed uplinks):

1. the job is placed from the project's own synthetic CCE inputs (a rank table and
   ``ranktable_tor.json`` whose scheduler order is scattered over the ToRs; spine shapes add a
   plain topology file with the spine tier, which CCE's file cannot carry);
2. every node namespace runs the rendered pod command (``bash bootstrap.sh`` and the rank files,
   a private /tmp per pod) once per collective, and the nodes' new ranks are read back from it;
3. one torch process per node runs real gloo collectives in the scheduler order, the planned
   order and a random order, rotating the orders between rounds: gloo's ``all_reduce`` (a ring;
   the bytes on every socket are measured to prove it), and halving-doubling and HCCL's NHR
   pattern built from send/recv, so the planner's ``rhd`` and ``nhr`` orders are measured too.

Reported per collective and order: time (slowest rank, median over rounds), algbw and busbw
(nccl-tests: busbw = algbw * 2(n-1)/n), busbw over the link rate, bytes on the busiest uplink
against the link model's prediction, and the measured ratio to the scheduler order beside the
predicted one (the scorer's, and the link model of ``_fabric_model`` that also knows the spines).
Machine load (load average, CPU busy) is reported beside the numbers.

Targets: planned reaches the ring lower bound and its measured busbw ratio to the
scheduler order is within 15% of the prediction on every shape; on 12x4 and 16:6,4,4,2 planned
is at least 2.5x the scheduler order; for rhd and nhr the planner's order is never slower than the
scheduler's; the default shapes run in under 5 minutes on 2 cores.

Needs root, ``ip``/``tc``/``ss`` (iproute2) and ``unshare``; without them it says why and exits
77. It removes every namespace, bridge and process it made, also on Ctrl-C and on errors.

Usage: ``python benchmarks/bench_fabric.py [--shapes 12x4 16:6,4,4,2 16x4/2@2] [--rate 100]
[--size 3MiB] [--rounds 3] [--output FILE] [--plot FILE.png|.svg]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

try:
    import _fabric_model as model
    import _fabric_net as net
    from _report import publish
    from npu_job.bootstrap import planner, scorer
    from npu_job.bootstrap.base.model import Collective, Plan, Topology
except ImportError:
    # An unprivileged user may not even be able to read a root-owned install; the fabric needs
    # root anyway, so say that (and exit as unavailable) rather than show the import's traceback.
    if os.geteuid() != 0:
        print(
            "bench_fabric: cannot build the emulated fabric: needs root (network namespaces, "
            "bridges and tc)",
            file=sys.stderr,
        )
        sys.exit(77)  # EXIT_UNAVAILABLE, defined below
    raise

EXIT_UNAVAILABLE = 77  # the "skipped" convention: this machine cannot build the fabric
EXIT_FAILED = 1  # a check of correctness failed (plans disagree, wrong sum, not a ring)
DEFAULT_SHAPES = ("12x4", "16:6,4,4,2", "16x4/2@2")
COLLECTIVES = (Collective.RING, Collective.RHD, Collective.NHR)
ORDERS = ("scheduler", "planned", "random")
HCCL_ALGO = {
    Collective.RING: None,
    Collective.RHD: "level0:NA;level1:H-D_R",
    Collective.NHR: "level0:NA;level1:NHR",
}
JOB, TASK = "fabric", "worker"
STORE_PORT = 29400
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RATIO_TOLERANCE = 0.15
TARGET_RATIO = {"12x4": 2.5, "16:6,4,4,2": 2.5}


STARTED = time.monotonic()


def log(message: str) -> None:
    print(
        f"bench_fabric: {time.monotonic() - STARTED:5.0f} s: {message}", file=sys.stderr, flush=True
    )


def size_bytes(text: str) -> int:
    """``4MiB``, ``512KiB``, ``1048576`` -> bytes (a multiple of 4: float32 elements)."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "b": 1}
    lowered = text.strip().lower()
    for unit, factor in units.items():
        if lowered.endswith(unit) and lowered[: -len(unit)].strip().isdigit():
            value = int(lowered[: -len(unit)]) * factor
            break
    else:
        if not lowered.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 4MiB or 65536")
        value = int(lowered)
    if value < 4096 or value % 4:
        raise argparse.ArgumentTypeError(f"{text!r}: expected at least 4096 bytes, a multiple of 4")
    return value


# ---------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """A shape's job: what the pods will read, and what the planner makes of it."""

    shape: model.Shape
    cluster: Any  # npu_job.demo.SimulatedCluster
    topology: Topology  # as the pods read it
    topology_file: Optional[str]  # plain topology text (spine shapes), else None
    tor_of_pod: Tuple[int, ...]
    plans: Mapping[Collective, Plan]


def make_job(shape: model.Shape, seed: int) -> Job:
    from npu_job.bootstrap.canonical import id_sort_key
    from npu_job.bootstrap.topology import parse_topology
    from npu_job.demo import cce_cluster
    from npu_job.demo.synthetic import synthetic_cluster

    from tests.bootstrap.documents import plain_topology_document  # the root is on sys.path: net

    ips = [net.pod_ip(pod) for pod in range(shape.nodes)]
    table, topology = synthetic_cluster(
        shape.nodes,
        shape.tors,
        npus_per_node=1,
        seed=seed,
        tor_sizes=shape.tor_sizes,
        spine_groups=shape.spines,
        job_name=JOB,
        scatter=True,
    )
    cluster = cce_cluster(table, topology, ips)
    seen = cluster.topology
    plain = None
    if shape.spines:  # CCE's ranktable_tor.json has ToRs only: the spine tier comes in a file
        renamed = {ips[s.pod_index]: topology.placements[s.server_id] for s in table.servers}
        plain = json.dumps(plain_topology_document(Topology(renamed, "synthetic")), indent=1)
        seen = parse_topology(plain.encode(), "topology.json")
    tors = sorted({p.tors[0] for p in seen.placements.values()}, key=id_sort_key)
    tor_of_pod = tuple(
        tors.index(seen.placement_of(s.server_id).tors[0]) for s in cluster.table.servers
    )
    sizes = tuple(tor_of_pod.count(t) for t in range(len(tors)))
    assert sizes == shape.tor_sizes, (sizes, shape.tor_sizes)
    plans = {c: planner.plan(cluster.table, seen, c) for c in COLLECTIVES}
    return Job(shape, cluster, seen, plain, tor_of_pod, plans)


def random_order(nodes: int, seed: int) -> Tuple[int, ...]:
    order = list(range(nodes))
    random.Random(seed).shuffle(order)
    return tuple(order)


# ---------------------------------------------------------------------------------------------
# pods: the rendered pod command in every namespace
# ---------------------------------------------------------------------------------------------
def stage_scripts(job: Job, workspace: Path) -> Tuple[str, Dict[str, str]]:
    """Render the job, stage its scripts; the container command and its literal env."""
    from npu_job.demo import podspec

    from npu_job import demo

    scripts = workspace / "scripts"
    cluster_dir = workspace / "cluster"
    demo.write_cluster_inputs(job.cluster, cluster_dir)
    env = {"RANK_TABLE_FILE": str(cluster_dir / "jobstart_hccl.json")}
    if job.topology_file is not None:
        (cluster_dir / "topology.json").write_text(job.topology_file)
        env["NPU_JOB_TOPOLOGY"] = str(cluster_dir / "topology.json")
    rendered = demo.render_job(
        {
            "name": JOB,
            "image": "fabric:local",
            "script": "/bin/true",
            "nodes": job.shape.nodes,
            "npus_per_node": 1,
            "device": "cpu",
            "task_name": TASK,
            "routing": True,
            "scripts_dir": str(scripts),
            "env": env,
        }
    )
    scripts.mkdir(parents=True)
    for name, text, _mode in rendered.files():
        if name == "bootstrap.sh":
            (scripts / name).write_text(text)
    # train.sh's place: say which node rank and master index the pod command gave it
    (scripts / "train.sh").write_text(
        'echo "fabric-pod node_rank=${RANK_AFTER_ACC} master_index=${MA_MASTER_INDEX}"\n'
    )
    _, manifest = podspec.find_job(demo.manifest_documents(rendered))
    container = manifest["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    literal = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    return container["command"][-1], literal


def run_pods(
    fabric: net.Fabric,
    job: Job,
    workspace: Path,
    collectives: Sequence[Collective],
    command: str,
    literal_env: Mapping[str, str],
) -> Dict[Collective, Tuple[int, ...]]:
    """Every pod's command once per collective (all at once); the order each collective's pods
    produced, checked against the planner's."""
    processes = {}
    for collective in collectives:
        for pod in range(job.shape.nodes):
            tmp = workspace / "pods" / collective.value / str(pod)
            tmp.mkdir(parents=True)
            tmp.chmod(0o1777)
            env = {
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "HOME": "/root",
                **literal_env,
                "MA_CURRENT_HOST_IP": net.pod_ip(pod),
                "VC_TASK_INDEX": str(pod),
                "MA_VJ_NAME": JOB,
                "MA_TASK_NAME": TASK,
                "NPU_JOB_PYTHON": sys.executable,
                "NPU_JOB_K8S_TOPOLOGY": "0",
                "NPU_JOB_WAIT_TIMEOUT": "20",
            }
            if HCCL_ALGO[collective]:
                env["HCCL_ALGO"] = HCCL_ALGO[collective]
            processes[(collective, pod)] = fabric.popen(
                pod,
                ["bash", "-c", command],
                env=env,
                private_tmp=tmp,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
    orders = {}
    for collective in collectives:
        orders[collective] = _pods_order(
            job, collective, [processes[(collective, pod)] for pod in range(job.shape.nodes)]
        )
    return orders


def _pods_order(
    job: Job, collective: Collective, processes: Sequence[subprocess.Popen]
) -> Tuple[int, ...]:
    ranks: Dict[int, int] = {}
    masters = set()
    for pod, process in enumerate(processes):
        out, _ = process.communicate(timeout=120)
        line = next((ln for ln in out.splitlines() if ln.startswith("fabric-pod ")), "")
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        if process.returncode != 0 or "node_rank" not in fields:
            raise RuntimeError(f"pod {pod} ({collective}): exit {process.returncode}: {out[-500:]}")
        ranks[pod] = int(fields["node_rank"])
        masters.add(int(fields["master_index"]))
    order = tuple(sorted(ranks, key=ranks.__getitem__))
    if sorted(ranks.values()) != list(range(job.shape.nodes)):
        raise RuntimeError(f"{collective}: the pods' node ranks are not a permutation: {ranks}")
    if masters != {order[0]}:
        raise RuntimeError(f"{collective}: master indices {sorted(masters)}, expected {order[0]}")
    if order != job.plans[collective].pod_of_node_rank:
        raise RuntimeError(
            f"{collective}: the pods' order {order} is not the planner's"
            f" {job.plans[collective].pod_of_node_rank}"
        )
    return order


# ---------------------------------------------------------------------------------------------
# workers: one torch process per node
# ---------------------------------------------------------------------------------------------
class Workers:
    """The torch workers and their line protocol (``_fabric_worker.py``); every wait bounded."""

    def __init__(self, fabric: net.Fabric, nodes: int, workspace: Path) -> None:
        config = workspace / "workers.json"
        config.write_text(
            json.dumps(
                {"nodes": nodes, "master": net.pod_ip(0), "port": STORE_PORT, "timeout": 300}
            )
        )
        self.selector = selectors.DefaultSelector()
        self.processes = []
        self.buffers: Dict[int, str] = {}
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": "/root",
            "GLOO_SOCKET_IFNAME": "eth0",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        for pod in range(nodes):
            stderr = open(workspace / f"worker-{pod}.log", "w")
            process = fabric.popen(
                pod,
                [sys.executable, str(HERE / "_fabric_worker.py"), str(config), str(pod)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
            stderr.close()
            os.set_blocking(process.stdout.fileno(), False)
            self.selector.register(process.stdout, selectors.EVENT_READ, pod)
            self.processes.append(process)
            self.buffers[pod] = ""
        self.workspace = workspace

    def collect(self, timeout: float) -> List[Dict[str, Any]]:
        """One JSON line from every worker within ``timeout`` seconds."""
        answers: Dict[int, Dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(answers) < len(self.processes):
            for pod, buffer in self.buffers.items():
                if pod not in answers and "\n" in buffer:
                    line, self.buffers[pod] = buffer.split("\n", 1)
                    answers[pod] = json.loads(line)
            if len(answers) == len(self.processes):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(len(self.processes))) - set(answers))
                raise TimeoutError(
                    f"workers {missing} did not answer within {timeout:.0f} s"
                    f" (see {self.workspace}/worker-*.log)"
                )
            for key, _ in self.selector.select(min(left, 1.0)):
                chunk = key.fileobj.read()
                if chunk:
                    self.buffers[key.data] += chunk.decode()
            for pod, process in enumerate(self.processes):
                waiting = pod not in answers and "\n" not in self.buffers[pod]
                if process.poll() is not None and waiting:
                    tail = (self.workspace / f"worker-{pod}.log").read_text()[-800:]
                    raise RuntimeError(f"worker {pod} exited {process.returncode}: {tail}")
        return [answers[pod] for pod in range(len(self.processes))]

    def send(self, command: Mapping[str, Any]) -> None:
        line = (json.dumps(command) + "\n").encode()
        for process in self.processes:
            process.stdin.write(line)
            process.stdin.flush()

    def quit(self) -> None:
        """Ask every worker to leave; the fabric kills whoever has not within a second (every
        answer is in: nothing is lost)."""
        try:
            self.send({"quit": True})
        except OSError:
            pass
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline and any(p.poll() is None for p in self.processes):
            time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------------
@dataclass
class Cell:
    """One collective in one order on one shape: every round's measurement."""

    collective: Collective
    order_name: str
    order: Tuple[int, ...]
    group: str = ""  # the workers' process group of this order
    seconds: List[float] = field(default_factory=list)  # slowest rank, per round
    cpu: List[float] = field(default_factory=list)  # all workers' CPU seconds, per round
    exact: List[Optional[bool]] = field(default_factory=list)
    uplink_bytes: List[Dict[model.Link, int]] = field(default_factory=list)
    ring: Optional[model.RingCheck] = None


@dataclass
class ShapeResult:
    job: Job
    rate: float  # bytes per second of a link
    nbytes: int
    cells: Dict[Tuple[Collective, str], Cell]
    load_before: str
    load_after: str
    cpu_busy: float  # fraction of the machine's CPU busy while measuring (everyone's work)
    wall: float


def _cpu_times() -> Tuple[float, float]:
    with open("/proc/stat") as handle:
        fields = [float(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields), idle


def _loadavg() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def measure_shape(shape: model.Shape, args: argparse.Namespace) -> ShapeResult:
    started = time.monotonic()
    load_before = _loadavg()
    job = make_job(shape, args.seed)
    rate = args.rate * 1e6 / 8
    workspace = Path(
        tempfile.mkdtemp(prefix=f"{net.PREFIX}{os.getpid()}-", dir=str(net.WORKSPACES))
    )
    try:
        with net.Fabric(shape, job.tor_of_pod, args.rate) as fabric:
            spines = (
                f", {shape.spines} spines at {shape.oversubscription:g}:1" if shape.spines else ""
            )
            log(
                f"{shape.text}: fabric up ({shape.nodes} nodes, {shape.tors} ToRs{spines},"
                f" {args.rate:g} Mbit/s links)"
            )
            command, literal_env = stage_scripts(job, workspace)
            workers = Workers(fabric, shape.nodes, workspace)  # torch loads while the pods plan
            planned = run_pods(fabric, job, workspace, args.collectives, command, literal_env)
            log(
                f"{shape.text}: every pod's bootstrap gave the planner's order for "
                + ", ".join(c.value for c in args.collectives)
            )
            orders = {
                "scheduler": tuple(range(shape.nodes)),
                "random": random_order(shape.nodes, args.seed),
            }
            for collective, order in planned.items():
                orders[f"planned-{collective.value}"] = order
            workers.send({"orders": {name: list(order) for name, order in orders.items()}})
            workers.collect(timeout=300)
            log(f"{shape.text}: {shape.nodes} workers ready")
            cells: Dict[Tuple[Collective, str], Cell] = {}
            for collective in args.collectives:
                for name in ORDERS:
                    key = f"planned-{collective.value}" if name == "planned" else name
                    cells[(collective, name)] = Cell(collective, name, orders[key], key)
            total0, idle0 = _cpu_times()
            for round_index in range(args.rounds):
                for collective in args.collectives:
                    rotated = ORDERS[round_index % 3 :] + ORDERS[: round_index % 3]
                    for name in rotated:
                        _measure(
                            fabric,
                            workers,
                            cells[(collective, name)],
                            args.size,
                            rate,
                            job,
                            sockets=round_index == 0 and collective is Collective.RING,
                        )
                log(f"{shape.text}: round {round_index + 1}/{args.rounds} done")
            total1, idle1 = _cpu_times()
            workers.quit()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    busy = 1 - (idle1 - idle0) / max(1e-9, total1 - total0)
    return ShapeResult(
        job, rate, args.size, cells, load_before, _loadavg(), busy, time.monotonic() - started
    )


def _measure(
    fabric: net.Fabric,
    workers: Workers,
    cell: Cell,
    nbytes: int,
    rate: float,
    job: Job,
    *,
    sockets: bool,
) -> None:
    expected = model.predict(job.shape, job.tor_of_pod, cell.order, cell.collective, nbytes, rate)
    before_sockets = [fabric.sockets(pod) for pod in range(job.shape.nodes)] if sockets else None
    before = fabric.uplink_bytes()
    workers.send({"run": cell.collective.value, "order": cell.group, "bytes": nbytes})
    answers = workers.collect(timeout=60 + 20 * expected.seconds)
    after = fabric.uplink_bytes()
    cell.seconds.append(max(a["t1"] - a["t0"] for a in answers))
    cell.cpu.append(sum(a["cpu"] for a in answers))
    oks = [a["ok"] for a in answers]
    cell.exact.append(None if any(ok is None for ok in oks) else all(oks))
    cell.uplink_bytes.append({link: after[link] - before[link] for link in after})
    if before_sockets is not None:
        ip_to_pod = {net.pod_ip(pod): pod for pod in range(job.shape.nodes)}
        sent = {}
        for pod in range(job.shape.nodes):
            by_ip = model.sent_by_peer(before_sockets[pod], fabric.sockets(pod), (STORE_PORT,))
            sent[pod] = {ip_to_pod[ip]: count for ip, count in by_ip.items() if ip in ip_to_pod}
        cell.ring = model.ring_check(sent, cell.order)


# ---------------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    shape: str
    collective: Collective
    order_name: str
    ring_edges: int
    ring_bound: int
    seconds: float
    algbw: float
    busbw: float
    busbw_per_link: float
    model_busbw_per_link: float  # the link model's busbw over the link rate (payload only)
    uplink_max_measured: float  # bytes on the busiest uplink, median over rounds
    uplink_max_predicted: float
    uplink_total_ratio: float  # measured / predicted bytes over all uplinks
    ratio_measured: Optional[float]  # busbw / the scheduler order's
    ratio_scorer: Optional[float]
    ratio_links: Optional[float]
    exact: Optional[bool]
    ring: Optional[model.RingCheck]


def rows_of(result: ShapeResult) -> List[Row]:
    job, shape = result.job, result.job.shape
    keys = scorer.switch_keys(job.cluster.table, job.topology)
    rows: List[Row] = []
    by_collective: Dict[Collective, Dict[str, Tuple[float, float, float]]] = {}
    for (collective, name), cell in result.cells.items():
        seconds = model.median(cell.seconds)
        algbw = model.algbw(result.nbytes, seconds)
        busbw = model.allreduce_busbw(algbw, shape.nodes)
        score = scorer.score_order(cell.order, keys, collective, uplinks=1, samples=0)
        predicted = model.predict(
            shape, job.tor_of_pod, cell.order, collective, result.nbytes, result.rate
        )
        by_collective.setdefault(collective, {})[name] = (
            busbw,
            score.best_busbw_fraction,
            predicted.seconds,
        )
        links = model.uplinks(shape)
        measured_max = model.median([max(r[link] for link in links) for r in cell.uplink_bytes])
        predicted_total = sum(predicted.link_bytes.get(link, 0.0) for link in links)
        measured_total = model.median([sum(r[link] for link in links) for r in cell.uplink_bytes])
        exacts = set(cell.exact)
        rows.append(
            Row(
                shape.text,
                collective,
                name,
                score.ring_cross_edges,
                score.ring_lower_bound,
                seconds,
                algbw,
                busbw,
                busbw / result.rate,
                model.allreduce_busbw(model.algbw(result.nbytes, predicted.seconds), shape.nodes)
                / result.rate,
                measured_max,
                max(predicted.link_bytes.get(link, 0.0) for link in links),
                measured_total / predicted_total if predicted_total else float("nan"),
                None,
                None,
                None,
                None if None in exacts else exacts == {True},
                cell.ring,
            )
        )
    finished = []
    for row in rows:
        base = by_collective[row.collective]["scheduler"]
        mine = by_collective[row.collective][row.order_name]
        finished.append(
            Row(
                **{
                    **row.__dict__,
                    "ratio_measured": mine[0] / base[0],
                    "ratio_scorer": mine[1] / base[1],
                    "ratio_links": base[2] / mine[2],
                }
            )
        )
    return finished


def table_lines(results: Sequence[ShapeResult], args: argparse.Namespace) -> List[str]:
    lines = [
        f"bench_fabric: {args.rate:g} Mbit/s links (node links and ToR uplinks; spine uplinks"
        f" = their ToRs' together / oversubscription), {args.size / 2**20:g} MiB float32"
        f" allreduce, {args.rounds} rounds (orders rotated), gloo over TCP, MTU 9000",
        "time = slowest rank, median over rounds; busbw = algbw * 2(n-1)/n (nccl-tests);"
        " up max = bytes on the busiest uplink, measured / predicted (MB);"
        " up sum = all uplink bytes measured / predicted (headers included);"
        " x = busbw over the scheduler order's: measured, scorer (1 uplink per ToR), link model",
        "",
        "| shape | coll | order | ring x-edges (bound) | time s | algbw MB/s | busbw MB/s |"
        " busbw/link | up max MB | up sum | x measured | x scorer | x links | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for row in rows_of(result):
            exact = {True: "yes", False: "NO", None: "n/a"}[row.exact]
            edges = (
                f"{row.ring_edges} ({row.ring_bound})" if row.collective is Collective.RING else "-"
            )
            lines.append(
                f"| {row.shape} | {row.collective.value} | {row.order_name} |"
                f" {edges} | {row.seconds:.2f} |"
                f" {row.algbw / 1e6:.2f} | {row.busbw / 1e6:.2f} | {row.busbw_per_link:.2f} |"
                f" {row.uplink_max_measured / 1e6:.1f} / {row.uplink_max_predicted / 1e6:.1f} |"
                f" {row.uplink_total_ratio:.2f} | {row.ratio_measured:.2f} |"
                f" {row.ratio_scorer:.2f} | {row.ratio_links:.2f} | {exact} |"
            )
    lines.append("")
    for result in results:
        lines.append(
            f"{result.job.shape.text}: load average {result.load_before} -> {result.load_after};"
            f" machine CPU busy {100 * result.cpu_busy:.0f}% while measuring (all processes);"
            f" {result.wall:.0f} s"
        )
    return lines


def verdict_lines(
    results: Sequence[ShapeResult], elapsed: float, default_run: bool
) -> Tuple[List[str], bool]:
    """The targets, each with its verdict; and whether every correctness check passed."""
    lines = ["", "targets"]
    correct = True
    for result in results:
        rows = {(r.collective, r.order_name): r for r in rows_of(result)}
        shape = result.job.shape.text
        ring = rows.get((Collective.RING, "planned"))
        if ring is not None:
            at_bound = ring.ring_edges == ring.ring_bound
            off = ring.ratio_measured / ring.ratio_links - 1
            lines.append(
                f"  {shape} ring: planned at the ring lower bound: {'yes' if at_bound else 'NO'}"
                f" ({ring.ring_edges} cross-ToR edges, bound {ring.ring_bound});"
                f" measured x{ring.ratio_measured:.2f} vs predicted x{ring.ratio_links:.2f}"
                f" ({int(round(100 * off)):+d}%, target within {100 * RATIO_TOLERANCE:.0f}%):"
                f" {'met' if abs(off) <= RATIO_TOLERANCE else 'MISSED'}"
            )
            if shape in TARGET_RATIO:
                met = ring.ratio_measured >= TARGET_RATIO[shape]
                lines.append(
                    f"  {shape} ring: planned/scheduler x{ring.ratio_measured:.2f},"
                    f" target >= x{TARGET_RATIO[shape]:g}: {'met' if met else 'MISSED'}"
                )
        for collective in (Collective.RHD, Collective.NHR):
            row = rows.get((collective, "planned"))
            if row is not None:
                lines.append(
                    f"  {shape} {collective.value}: planner's order x{row.ratio_measured:.2f} of"
                    f" the scheduler's busbw (predicted x{row.ratio_links:.2f}); never slower:"
                    f" {'met' if row.ratio_measured >= 1 else 'MISSED'}"
                )
        for (collective, name), cell in result.cells.items():
            if cell.ring is not None:
                is_ring = cell.ring.direction != 0 and cell.ring.worst_share >= 0.95
                correct &= is_ring
                lines.append(
                    f"  {shape} gloo all_reduce in the {name} order is a ring:"
                    f" {'yes' if is_ring else 'NO'} (every rank sent >="
                    f" {100 * cell.ring.worst_share:.1f}% of its bytes to rank"
                    f" {'r+1' if cell.ring.direction > 0 else 'r-1'};"
                    f" {cell.ring.bytes_per_rank / 1e6:.2f} MB per rank, 2(n-1)/n of the buffer is"
                    f" {model.allreduce_busbw(result.nbytes, result.job.shape.nodes) / 1e6:.2f})"
                )
            if False in cell.exact:
                correct = False
                lines.append(f"  {shape} {collective.value} {name}: WRONG allreduce result")
    unchecked = sorted(
        {f"{r.job.shape.text}" for r in results for c in r.cells.values() if None in c.exact}
    )
    if unchecked:
        lines.append(
            f"  nhr on {', '.join(unchecked)}: n is not a power of two; the schedule"
            " moves the model's volumes between the model's pairs but computes no sum"
            " (HCCL's NHR schedule for such n is unpublished)"
        )
    if default_run:
        lines.append(
            f"  the default shapes ran in {elapsed:.0f} s, target under 300 s:"
            f" {'met' if elapsed < 300 else 'MISSED'}"
        )
    else:
        lines.append(f"  ran in {elapsed:.0f} s")
    return lines, correct


def plot(results: Sequence[ShapeResult], path: str, rate_mbit: float) -> None:
    """Busbw over the link rate by order, per shape and collective; predictions as ticks."""
    from npu_job.cli.picture import figure, save_figure

    groups = [
        (result, collective)
        for result in results
        for collective in COLLECTIVES
        if (collective, "scheduler") in result.cells
    ]
    fig = figure(width=max(6.0, 1.3 * len(groups) + 1.5), height=4.2)
    axes = fig.add_subplot(1, 1, 1)
    colours = {"scheduler": "#c44e52", "planned": "#4c72b0", "random": "#999999"}
    width = 0.26
    for index, (result, collective) in enumerate(groups):
        rows = {r.order_name: r for r in rows_of(result) if r.collective is collective}
        for offset, name in enumerate(ORDERS):
            row = rows[name]
            x = index + (offset - 1) * width
            axes.bar(
                x,
                row.busbw_per_link,
                width * 0.95,
                color=colours[name],
                label=name if index == 0 else None,
            )
            axes.plot(
                [x - width / 2, x + width / 2],
                [row.model_busbw_per_link] * 2,
                color="black",
                lw=1.2,
                label="link model" if index == 0 and name == "scheduler" else None,
            )
    axes.set_xticks(range(len(groups)))
    axes.set_xticklabels([f"{r.job.shape.text}\n{c.value}" for r, c in groups], fontsize=8)
    axes.set_ylabel(f"busbw / link rate ({rate_mbit:g} Mbit/s)")
    axes.set_title("Measured on an emulated fabric: gloo allreduce by node order")
    axes.set_ylim(0, 1.18)
    axes.axhline(1.0, color="#444444", lw=0.6, ls=":")
    axes.legend(fontsize=8, loc="upper right", ncol=2)
    fig.tight_layout()
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def _collectives(text: str) -> Tuple[Collective, ...]:
    try:
        chosen = tuple(Collective(part.strip()) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a subset of ring,rhd,nhr") from None
    if not chosen:
        raise argparse.ArgumentTypeError("expected at least one collective")
    return chosen


def _shape(text: str) -> model.Shape:
    try:
        return model.parse_shape(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
        return value

    return parse


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 done (targets are reported, not enforced), 1 a correctness check"
        f" failed, 2 bad flags, {EXIT_UNAVAILABLE} cannot build the fabric here (needs"
        " root and ip netns), 130 interrupted.",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=_shape,
        metavar="SHAPE",
        default=[model.parse_shape(s) for s in DEFAULT_SHAPES],
        help=f"{model.SHAPE_SYNTAX} (default: {' '.join(DEFAULT_SHAPES)})",
    )
    parser.add_argument(
        "--rate",
        type=_positive(float),
        default=100.0,
        metavar="MBIT",
        help="rate of every node link and ToR uplink in Mbit/s (default 100)",
    )
    parser.add_argument(
        "--size",
        type=size_bytes,
        default=3 << 20,
        help="allreduce buffer, e.g. 4MiB (default 3MiB: the default shapes then"
        " finish within 5 minutes on a busy 2-core machine)",
    )
    parser.add_argument(
        "--rounds",
        type=_positive(int),
        default=3,
        help="rounds; each runs every collective in every order (default 3)",
    )
    parser.add_argument(
        "--collectives",
        type=_collectives,
        default=COLLECTIVES,
        help="subset of ring,rhd,nhr (default all)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the placement and of the random order (default 0)",
    )
    parser.add_argument("--output", metavar="FILE", help="also write the table to FILE")
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="also draw busbw by order and shape to FILE (.png or .svg;"
        " needs the [picture] extra: matplotlib)",
    )
    args = parser.parse_args(list(argv))
    if args.plot and not args.plot.lower().endswith((".png", ".svg")):
        parser.error(f"--plot {args.plot}: expected a file name ending in .png or .svg")
    return args


def main(argv: Sequence[str] = ()) -> int:
    args = parse_args(argv)
    if args.plot:
        from npu_job.cli.picture import require_matplotlib
        from npu_job.errors import NpuJobError, report_error

        try:
            require_matplotlib()
        except NpuJobError as error:
            return report_error(error, "bench_fabric")
    if not net.begin("bench_fabric", log):
        return EXIT_UNAVAILABLE
    default_run = [s.text for s in args.shapes] == list(DEFAULT_SHAPES)
    started = time.monotonic()
    results: List[ShapeResult] = []
    try:
        for shape in args.shapes:
            results.append(measure_shape(shape, args))
    except KeyboardInterrupt:
        log("interrupted; everything it made is removed")
        return 130
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired, OSError) as error:
        log(f"error: {error}; everything it made is removed")
        return EXIT_FAILED
    elapsed = time.monotonic() - started
    verdicts, correct = verdict_lines(results, elapsed, default_run)
    publish("\n".join(table_lines(results, args) + verdicts) + "\n", args.output)
    if args.plot:
        plot(results, args.plot, args.rate)
        log(f"wrote {args.plot}")
    return 0 if correct else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
