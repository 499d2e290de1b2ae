"""``npu-job demo``: the whole pipeline on one machine, on a simulated cluster.

The chain is the real one (render, every pod's bootstrap, npu-run, a DDP training); only the
cluster is simulated. Pure halves apart from the halves that make system calls:

* ``scenario`` (pure): the options, the simulated cluster and its CCE files, the job spec;
* ``checks`` (pure): the plan every pod must reach, the checks of what the pods left, the result;
* ``podlog`` (pure): what a line of a pod's log says;
* ``runner`` (edge): stage the pods, start and supervise them, read what they left;
* ``images`` (edge): what software the pods' image holds (by default a stock python3 with torch
  and no npu-job);
* ``podspec`` (pure): the rendered job object -> one pod spec per pod, as its kind's controller
  (the kind's record, :mod:`npu_job.kinds`) and the kubelet would make them;
* ``podsim`` (edge): one pod as an isolated process: namespaces, mounts, chroot
  (``python -m npu_job.demo.podsim enter``);
* ``synthetic`` (pure): generated clusters, a realistic rank table and switch topology from a
  few numbers (the scenario's and the benchmarks').

The names below are the demo's API for the CLI (``npu_job.cli.demo``), the end-to-end tests and
the benchmarks; each is defined in the module it is imported from.
"""

from .checks import (
    DemoResult,
    Phases,
    PodOutcome,
    Prepared,
    RingScore,
    api_plan,
    bundle_identity,
    check_outcome,
    describe_plan,
    expect_routing,
    expected_plan,
    ring_score,
    tor_of_pod,
)
from .images import Image, find_interpreter, make_image, offered_images
from .podlog import PodLine, first_line, read_pod_line
from .runner import (
    PROGRESS_EVERY,
    Supervisor,
    default_workspace,
    example_script,
    free_port,
    keep_directory_problem,
    prepare,
    read_outcomes,
    run,
    write_cluster_inputs,
)
from .scenario import (
    DEVICES,
    EXAMPLE_SCRIPT,
    IMAGES,
    INPUT_FILES,
    JOB_NAME,
    KINDS,
    LOOPBACK_BASE,
    RANK_TABLE_CONFIGMAP,
    RANK_TABLE_DIR,
    SHARED_MOUNT,
    SUMMARY_VERSION,
    TASK_NAME,
    TOPOLOGY_CONFIGMAP,
    TOPOLOGY_DIR,
    ClusterAPI,
    DemoOptions,
    SimulatedCluster,
    cce_cluster,
    cluster_objects,
    controller_rank_table,
    demo_device,
    demo_spec_values,
    job_pods,
    loopback_ips,
    manifest_documents,
    render_job,
    rendered_pods,
    simulated_cluster,
    user_configmaps,
)

__all__ = [
    "DEVICES",
    "EXAMPLE_SCRIPT",
    "IMAGES",
    "INPUT_FILES",
    "JOB_NAME",
    "LOOPBACK_BASE",
    "PROGRESS_EVERY",
    "RANK_TABLE_CONFIGMAP",
    "RANK_TABLE_DIR",
    "SHARED_MOUNT",
    "SUMMARY_VERSION",
    "TASK_NAME",
    "api_plan",
    "bundle_identity",
    "cce_cluster",
    "check_outcome",
    "ClusterAPI",
    "cluster_objects",
    "controller_rank_table",
    "demo_device",
    "KINDS",
    "TOPOLOGY_CONFIGMAP",
    "TOPOLOGY_DIR",
    "default_workspace",
    "demo_spec_values",
    "DemoOptions",
    "DemoResult",
    "describe_plan",
    "example_script",
    "expect_routing",
    "expected_plan",
    "find_interpreter",
    "first_line",
    "free_port",
    "Image",
    "job_pods",
    "keep_directory_problem",
    "loopback_ips",
    "make_image",
    "manifest_documents",
    "offered_images",
    "Phases",
    "PodLine",
    "PodOutcome",
    "prepare",
    "Prepared",
    "user_configmaps",
    "read_outcomes",
    "read_pod_line",
    "render_job",
    "rendered_pods",
    "ring_score",
    "RingScore",
    "run",
    "simulated_cluster",
    "SimulatedCluster",
    "Supervisor",
    "tor_of_pod",
    "write_cluster_inputs",
]
