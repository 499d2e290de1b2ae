"""Every kind's record knows the longest name its controller makes of a job that must be a DNS
label (63 characters), so that render refuses a job name that would make a pod the API rejects:
checked against the pods the record's own ``controller_pods`` makes of each kind's rendered job."""

from __future__ import annotations

import pytest
from npu_job.demo import scenario
from npu_job.kinds import KIND_NAMES, KINDS


@pytest.mark.parametrize("nodes", [2, 11])
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_the_longest_name_is_the_longest_the_controller_makes(kind, nodes):
    options = scenario.DemoOptions(
        kind=kind, device=scenario.demo_device(kind), nodes=nodes, tors=1, routing=False
    )
    pods = scenario.job_pods(options)
    longest, what = KINDS[kind].longest_name(scenario.JOB_NAME, scenario.TASK_NAME, nodes)
    # what the message says must be a DNS label: the pod's hostname, or (JobSet, TrainJob: the
    # webhook's rule) its name
    names = [pod.hostname if "hostname" in what else pod.name for pod in pods]
    assert len(longest) == max(map(len, names)), (longest, names)
