"""Running one set of input files through every entry that reads them, and checking the promise.

A bad input must give one line ``npu-job: error: <file>: <field>: <what was expected>`` and no
traceback on each of the three entries that read rank tables and topologies:

* the pod path, ``npu-job bootstrap`` (exit 0, a failed ``route_plan.json`` whose reason is that
  line, no rank files: the pod keeps the scheduler order);
* the same with ``--strict`` (exit 3, the same line);
* ``npu-job plan`` (exit 3, the same line).

An input that is merely unusual must be planned alike by all three. Everything runs in-process
through :func:`npu_job.cli.main`, under the JSON engine the caller chose (``tests/bootstrap/
engines.py``).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from npu_job.cli import main
from npu_job.podfacts import NODE_REPORT_FILE, ROUTE_PLAN_FILE
from tests.bootstrap.engines import json_engine

EXIT_INPUT = 3
LINE_LIMIT = 600  # characters: a file name, a field path and an expectation with a short value

V1_0_IDS = ("192.168.0.11", "192.168.0.12", "192.168.0.13")  # documents.v1_0's servers
TOR_INFO_IDS = ("1.1.0.0", "1.1.0.1", "1.1.0.4")  # three of documents.tor_info's servers


def plain_topology(ids: Sequence[str]) -> Dict[str, Any]:
    """A plain topology file placing ``ids`` on two ToRs, alternately."""
    return {"servers": {sid: ["tor-a" if i % 2 else "tor-b"] for i, sid in enumerate(ids)}}


def set_field(document: Any, keys: Sequence[Any], value: Any) -> Any:
    """``document`` with the field at ``keys`` (object keys and array indices) set to ``value``."""
    target = document
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value
    return document


@dataclass(frozen=True)
class Entry:
    """How one entry ended: its exit code and its stderr lines."""

    name: str
    code: int
    stderr: List[str]
    stdout: List[str]

    @property
    def errors(self) -> List[str]:
        return [line for line in self.stderr if line.startswith("npu-job: error: ")]


@dataclass(frozen=True)
class Outcome:
    pod: Entry
    strict: Entry
    plan: Entry
    route_plan: dict
    out_dir: Path
    route_plan_size: int

    @property
    def entries(self) -> List[Entry]:
        return [self.pod, self.strict, self.plan]


def clean_environment(monkeypatch) -> None:
    """No inherited pod settings; no Kubernetes API in the topology chain; a rank table that does
    not decode is reported at once instead of polled for (it would be for 300 s)."""
    for name in list(os.environ):
        if name.startswith(("NPU_JOB_", "KUBERNETES_", "MA_", "VC_", "RANK_TABLE", "HCCL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NPU_JOB_K8S_TOPOLOGY", "0")
    monkeypatch.setenv("NPU_JOB_WAIT_TIMEOUT", "0")
    package_logger = logging.getLogger(
        "npu_job"
    )  # main() sets it up; other tests' caplog needs it back
    monkeypatch.setattr(package_logger, "handlers", list(package_logger.handlers))
    monkeypatch.setattr(package_logger, "propagate", package_logger.propagate)
    monkeypatch.setattr(package_logger, "level", package_logger.level)


def run_everywhere(
    rank_table: Path,
    topology: Optional[Path],
    host_ip: str,
    out_dir: Path,
    capsys,
    engine: str,
    topology_format: Optional[str] = None,
) -> Outcome:
    """Run the pod path, ``--strict`` and ``npu-job plan`` on the same files under ``engine``."""
    reads = ["--rank-table", str(rank_table)]
    if topology is not None:
        reads += ["--topology", str(topology)]
    if topology_format is not None:
        reads += ["--topology-format", topology_format]
    pod_flags = [*reads, "--host-ip", host_ip, "--output-dir", str(out_dir)]
    entries = []
    capsys.readouterr()
    with json_engine(engine):
        for name, argv in (
            ("pod", ["bootstrap", *pod_flags]),
            ("strict", ["bootstrap", *pod_flags, "--strict"]),
            ("plan", ["plan", *reads, "--samples", "0"]),
        ):
            code = main(argv)
            if name == "pod":
                route_plan_bytes = (out_dir / ROUTE_PLAN_FILE).read_bytes()
            captured = capsys.readouterr()
            entries.append(Entry(name, code, captured.err.splitlines(), captured.out.splitlines()))
    return Outcome(
        *entries,
        route_plan=json.loads(route_plan_bytes),
        out_dir=out_dir,
        route_plan_size=len(route_plan_bytes),
    )


def assert_one_line_error(outcome: Outcome, prefix: str) -> str:
    """Every entry gave one bounded error line starting ``npu-job: error: <prefix>``, the same
    line everywhere, no traceback; the pod fell back. Returns the line."""
    lines = set()
    for entry in outcome.entries:
        assert not any("Traceback" in line for line in entry.stderr), (entry.name, entry.stderr)
        assert len(entry.errors) == 1, (entry.name, entry.stderr)
        line = entry.errors[0]
        assert line.startswith(f"npu-job: error: {prefix}"), (entry.name, line[:300])
        assert len(line) <= LINE_LIMIT, (entry.name, len(line), line[:300])
        lines.add(line)
    assert len(lines) == 1, lines
    assert outcome.pod.code == 0
    assert outcome.strict.code == EXIT_INPUT and outcome.plan.code == EXIT_INPUT
    assert outcome.route_plan["status"] == "failed"
    assert f"npu-job: error: {outcome.route_plan['reason']}" == lines.pop()
    assert sorted(os.listdir(outcome.out_dir)) == [NODE_REPORT_FILE, ROUTE_PLAN_FILE], (
        "no rank files"
    )
    return outcome.pod.errors[0]


def assert_planned(outcome: Outcome) -> None:
    """Every entry read the inputs and planned, without an error line."""
    for entry in outcome.entries:
        assert entry.code == 0 and not entry.errors, (entry.name, entry.stderr[:3])
    assert outcome.route_plan["status"] == "success", outcome.route_plan["reason"][:300]
