"""podsim: a rendered Volcano Job becomes the pods a cluster would start, and each runs isolated.

The pure half is checked against the renderer's real output (what the kubelet would pass to the
container: env from field refs, Kubernetes' $(VAR) expansion, the svc plugin's names and files).
The edge half starts real pods under `unshare` (as root, and in a user namespace as an
unprivileged user gets) and checks from inside what they see, and from outside that the host was
not touched.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from npu_job.demo import images, podsim, podspec

from npu_job.errors import InputError, LaunchError

IPS = ("127.0.0.20", "127.0.0.21", "127.0.0.22")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("$(A)", "a"),
        ("x$(A)y$(B)z", "xayb-z"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("$(NOPE)", "$(NOPE)"),
        ("$(cat /tmp/RANK_AFTER_ACC 2>/dev/null)", "$(cat /tmp/RANK_AFTER_ACC 2>/dev/null)"),
        ("${A}", "${A}"),
        ("$A", "$A"),
        ("$", "$"),
        ("a$", "a$"),
        ("$(A", "$(A"),
        ("$$$(A)", "$a"),
    ],
    ids=[
        "ref",
        "refs-in-text",
        "escaped-ref",
        "escaped-dollar",
        "unknown-kept",
        "command-substitution-kept",
        "braces-are-shell",
        "bare-dollar-name",
        "lone-dollar",
        "trailing-dollar",
        "unclosed",
        "escape-then-ref",
    ],
)
def test_kubelet_reference_expansion(text, expected):
    assert podspec.expand_references(text, {"A": "a", "B": "b-"}) == expected


def rendered_job(**overrides):
    from npu_job.render.render import render
    from npu_job.render.spec import validate
    from npu_job.render.values import SpecInput, merge_values

    values = {
        "name": "job",
        "image": "img",
        "script": "/code/train.py",
        "nodes": 3,
        "npus_per_node": 8,
        "device": "npu",
        **overrides,
    }
    return render(validate(merge_values([SpecInput("test", values)])))


def specs_of(rendered, **kwargs):
    import yaml

    documents = [doc for doc in yaml.safe_load_all(rendered.stream()) if doc]
    return podspec.pod_specs(documents, IPS, **kwargs)


def test_rendered_job_gives_each_pod_the_volcano_env_names_and_files():
    rendered = rendered_job()
    specs = specs_of(
        rendered,
        image_env=podspec.image_environment(
            {"PATH": "/usr/bin", "RANK": "9", "VC_TASK_INDEX": "7", "MASTER_ADDR": "elsewhere"}
        ),
    )
    assert [spec.name for spec in specs] == ["job-worker-0", "job-worker-1", "job-worker-2"]
    for index, spec in enumerate(specs):
        env = spec.env_dict()
        assert env["PATH"] == "/usr/bin" and "RANK" not in env and "MASTER_ADDR" not in env
        assert env["VC_TASK_INDEX"] == env["VK_TASK_INDEX"] == str(index)
        assert env["MA_CURRENT_HOST_IP"] == IPS[index]
        assert env["MA_VJ_NAME"] == "job" and env["MA_TASK_NAME"] == "worker"
        assert env["VC_WORKER_HOSTS"] == "job-worker-0.job,job-worker-1.job,job-worker-2.job"
        assert env["VC_WORKER_NUM"] == "3"
        assert spec.argv == ("/bin/bash", "-c", rendered.pod_command)  # exactly as rendered
        assert spec.restart_policy == "OnFailure"
        hosts = podspec.hosts_file_text(spec)
        for other, ip in enumerate(IPS):
            assert f"{ip}\tjob-worker-{other}.job" in hosts
        mounted = {mount.mount_path: dict(mount.files) for mount in spec.file_mounts}
        scripts = dict(mounted[rendered.spec.scripts_dir])
        shipped = scripts.pop("npu-job.pyz").encode("utf-8", "surrogateescape")
        assert scripts == dict(rendered.scripts) and shipped == rendered.bundle.data
        assert "worker.host" in mounted["/etc/volcano"]


def test_the_image_puts_this_installation_first_on_the_pods_PATH():
    caller = {"PATH": "/usr/bin:/opt/venv/bin", "RANK": "3", "NPU_JOB_PYTHON": "/elsewhere/python"}
    installation = {"PATH": "/opt/venv/bin", "NPU_JOB_PYTHON": "/opt/venv/bin/python3.12"}
    env = podspec.image_environment(caller, installation)
    assert env == {"PATH": "/opt/venv/bin:/usr/bin", "NPU_JOB_PYTHON": "/opt/venv/bin/python3.12"}
    assert (
        podspec.image_environment({}, installation)["PATH"] == "/opt/venv/bin:" + podspec.IMAGE_PATH
    )


def test_this_installation_is_the_running_python_and_its_console_scripts():
    import sys

    path = podsim.this_installation()["PATH"].split(os.pathsep)
    assert path[0] == os.path.dirname(sys.executable)
    if Path(sys.prefix, "pyvenv.cfg").is_file():  # a virtualenv: its python3 is this interpreter
        assert "NPU_JOB_PYTHON" not in podsim.this_installation()


PY37 = images.find_interpreter(images.PY37)
NO_PY37 = "no CPython 3.7 on this machine (python3.7 on PATH or under pyenv): stock-py37 untested"


def callers_environment():
    """A caller whose PATH leads to this installation's commands and whose PYTHONPATH holds the
    checkout (where npu_job imports from): neither may reach a stock image."""
    import sys

    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "PYTHONPATH": root}


def image_runs(image, python, code):
    return subprocess.run(
        [python, "-c", code], env=image.env, cwd="/", capture_output=True, text=True, timeout=120
    )


@pytest.mark.torch
def test_a_stock_image_has_python3_with_torch_and_no_npu_job(tmp_path):
    import shutil

    image = images.make_image("stock", tmp_path / "image", callers_environment())
    path = image.env["PATH"]
    assert "PYTHONPATH" not in image.env and image.paths == (str(tmp_path / "image"),)
    assert shutil.which("npu-run", path=path) is None and shutil.which("npu-job", path=path) is None
    python3 = shutil.which("python3", path=path)
    assert python3.startswith(str(tmp_path / "image"))
    assert image_runs(image, python3, "import torch").returncode == 0
    missing = image_runs(image, python3, "import npu_job")
    assert "No module named 'npu_job'" in missing.stderr


@pytest.mark.skipif(PY37 is None, reason=NO_PY37)
def test_the_py37_image_bootstraps_on_3_7_and_names_the_torch_python_for_the_launcher(tmp_path):
    import shutil

    image = images.make_image("stock-py37", tmp_path / "image", callers_environment())
    python3 = shutil.which("python3", path=image.env["PATH"])
    version = image_runs(image, python3, "import sys; print(sys.version_info[:2])")
    assert version.stdout.strip() == "(3, 7)"
    launcher = image.env["NPU_JOB_LAUNCHER_PYTHON"]
    found = image_runs(image, launcher, "import importlib.util as u; assert u.find_spec('torch')")
    assert found.returncode == 0, found.stderr
    for python in (python3, launcher):
        assert image_runs(image, python, "import npu_job").returncode != 0


def test_without_a_py37_the_py37_image_is_not_offered_and_cannot_be_made(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "find_interpreter", lambda version, probe=True: None)
    assert images.offered_images() == ("stock", "installed")
    with pytest.raises(LaunchError, match="no CPython 3.7 on this machine"):
        images.make_image("stock-py37", tmp_path, os.environ)


@pytest.mark.parametrize(
    "name, ours",
    [
        ("npu_job", True),
        ("npu_job-0.1.0.dist-info", True),
        ("__editable__.npu_job-0.1.0.pth", True),
        ("__editable___npu_job_0_1_0_finder.py", True),
        ("npu-job.egg-link", True),
        ("torch", False),
        ("distutils-precedence.pth", False),
        ("npu", False),
    ],
)
def test_a_stock_image_links_everything_in_site_packages_but_npu_jobs_own(name, ours):
    assert images._is_npu_job(name) is ours


def test_hostile_env_values_reach_the_process_exactly_as_written():
    hostile = "$(MA_VJ_NAME) $$ `id` $(id) \"q\" 'q' \n# - : x"
    spec = specs_of(rendered_job(env={"HOSTILE": hostile}))[0]
    assert spec.env_dict()["HOSTILE"] == hostile


def test_cluster_files_are_mounted_where_the_plugin_puts_them():
    files = podspec.cce_cluster_files('{"status": "completed"}', "H4sI")
    spec = specs_of(rendered_job(), cluster_files=files)[0]
    mounted = {mount.mount_path: mount for mount in spec.file_mounts}
    assert mounted["/user/config/jobstart_hccl.json"].files == (
        ("jobstart_hccl.json", '{"status": "completed"}'),
    )
    assert mounted["/user/config/ranktable_tor.json"].single_file


def job_document(container=None, volumes=(), replicas=3):
    container = {"name": "c", "image": "i", "command": ["true"], **(container or {})}
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {
            "plugins": {"env": [], "svc": []},
            "tasks": [
                {
                    "name": "w",
                    "replicas": replicas,
                    "template": {"spec": {"containers": [container], "volumes": list(volumes)}},
                }
            ],
        },
    }


@pytest.mark.parametrize(
    "documents, field",
    [
        (
            [
                job_document(
                    {
                        "env": [
                            {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}
                        ]
                    }
                )
            ],
            "spec.tasks[0].template.spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
        ),
        (
            [
                job_document(
                    {
                        "env": [
                            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                        ]
                    }
                )
            ],
            "spec.tasks[0].template.spec.containers[0].env[0].valueFrom",
        ),
        (
            [
                job_document(
                    {"volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                    [{"name": "v", "configMap": {"name": "absent"}}],
                )
            ],
            "volumes[v].configMap.name",
        ),
        (
            [
                job_document(
                    {"volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                    [{"name": "v", "nfs": {"server": "x"}}],
                )
            ],
            "volumes[v]",
        ),
        (
            [job_document({"volumeMounts": [{"name": "nope", "mountPath": "/v"}]})],
            "spec.tasks[0].template.spec.containers[0].volumeMounts[0].name",
        ),
        ([job_document(replicas=2)], "spec.tasks[*].replicas"),
        ([], "kind"),
    ],
    ids=[
        "unsupported-fieldref",
        "secret-ref",
        "missing-configmap",
        "nfs-volume",
        "undeclared-volume",
        "pods-vs-addresses",
        "no-job",
    ],
)
def test_what_a_cluster_could_not_start_is_a_precise_input_error(documents, field):
    with pytest.raises(InputError) as error:
        podspec.pod_specs(documents, IPS)
    assert error.value.field == field


# -- edge: real pods -------------------------------------------------------------------------
UNSHARE = podsim.unshare_unavailable_reason()

PROBE = r"""
hostname; cat /etc/hosts; echo "tmp=[$(ls -A /tmp)]"; touch /tmp/mine
cat /user/config/jobstart_hccl.json; echo; ls /opt/npu-job; cat /etc/volcano/VC_W_HOSTS; echo
echo "shared=$(cat /job/in.txt)"; echo out > /job/out.txt; pwd; echo "pid=$$"
setsid sleep 300 &
"""


# Where the probe pod mounts or writes something, and the directories above: what a pod could
# touch on the host. Some exist on real machines (a ModelArts notebook has /user/config).
TOUCHABLE = (
    "/user",
    "/user/config",
    "/opt",
    "/opt/npu-job",
    "/home",
    "/home/ma-user",
    "/home/ma-user/work",
    "/etc/volcano",
    "/etc/hosts",
    "/tmp/mine",
)


def host_state(paths=TOUCHABLE):
    """What the host has at ``paths``: absent, a directory's entries, or a file's bytes."""
    import hashlib

    state = {}
    for path in map(Path, paths):
        if path.is_dir():
            state[str(path)] = sorted(entry.name for entry in path.iterdir())
        elif path.exists():
            state[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            state[str(path)] = None
    return state


@pytest.fixture
def host_user_config():
    """/user/config as on a ModelArts notebook (with a file in it) for the test's duration; only what
    this fixture created is removed afterwards."""
    config = Path("/user/config")
    created = []
    if not config.exists():
        try:
            for directory in (config.parent, config):
                if not directory.exists():
                    directory.mkdir()
                    created.append(directory)
            marker = config / "notebook.marker"
            marker.write_text("the notebook's own file\n")
            created.append(marker)
        except OSError:  # not root: the test runs against the machine as it is
            pass
    try:
        yield config
    finally:
        for path in reversed(created):
            path.rmdir() if path.is_dir() else path.unlink()


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
@pytest.mark.parametrize("user_namespace", [False, True], ids=["root", "user-namespace"])
def test_a_pod_sees_its_own_host_and_leaves_the_machine_untouched(
    tmp_path, user_namespace, host_user_config
):
    if not user_namespace and os.geteuid() != 0:
        pytest.skip("mount namespaces without a user namespace need root")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "in.txt").write_text("from the host")
    documents = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "scripts"},
            "data": {"probe.sh": PROBE},
        },
        job_document(
            {
                "command": ["/bin/bash", "-c"],
                "args": ["bash /opt/npu-job/probe.sh"],
                "workingDir": "/home/ma-user/work",
                "volumeMounts": [
                    {"name": "scripts", "mountPath": "/opt/npu-job"},
                    {"name": "shared", "mountPath": "/job"},
                ],
            },
            [
                {"name": "scripts", "configMap": {"name": "scripts"}},
                {"name": "shared", "hostPath": {"path": str(shared)}},
            ],
            replicas=2,
        ),
    ]
    specs = podspec.pod_specs(
        documents,
        IPS[:2],
        image_env={"PATH": os.environ["PATH"]},
        cluster_files=podspec.cce_cluster_files('{"table": 1}', None),
    )
    before = host_state()
    outputs = []
    for attempt in range(2):  # the second attempt is a container restart: /tmp starts empty again
        spec_file = podsim.stage_pod(specs[1], tmp_path / "pods" / specs[1].name)
        pod = podsim.start_pod(spec_file, attempt=attempt, user_namespace=user_namespace)
        assert pod.process.wait(timeout=60) == 0, (spec_file.parent / "pod.log").read_text()
        outputs.append((spec_file.parent / "pod.log").read_text().split(f"attempt {attempt}\n")[-1])
    out = outputs[-1]
    assert out.splitlines()[0] == "j-w-1"
    assert "127.0.0.20\tj-w-0.j" in out and "127.0.0.21\tj-w-1.j j-w-1" in out
    # private and fresh on restart: only this machine's own Python/npu-job, when under /tmp
    carried = sorted(
        {Path(path).relative_to("/tmp").parts[0] for path in podsim.software_under_tmp()}
    )
    assert f"tmp=[{chr(10).join(carried)}]" in out
    assert '{"table": 1}' in out and "probe.sh" in out and "j-w-0.j,j-w-1.j" in out
    assert "shared=from the host" in out and "/home/ma-user/work" in out and "pid=1" in out
    assert (shared / "out.txt").read_text() == "out\n"
    assert (tmp_path / "pods" / "j-w-1" / "tmp" / "mine").exists()
    assert host_state() == before, "the pod touched the host"
    assert podsim.processes_inside(tmp_path) == []  # the setsid'd sleep died with the pod


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_killing_a_pod_kills_every_process_in_it(tmp_path):
    documents = [
        job_document({"command": ["/bin/bash", "-c", "setsid sleep 300 & sleep 300"]}, replicas=1)
    ]
    spec = podspec.pod_specs(documents, IPS[:1], image_env={"PATH": os.environ["PATH"]})[0]
    pod = podsim.start_pod(podsim.stage_pod(spec, tmp_path / spec.name))
    for _ in range(100):
        if len(podsim.processes_inside(tmp_path)) >= 3:
            break
        subprocess.run(["sleep", "0.05"])
    assert len(podsim.processes_inside(tmp_path)) >= 3
    pod.kill()
    for _ in range(100):
        if not podsim.processes_inside(tmp_path):
            break
        subprocess.run(["sleep", "0.05"])
    assert podsim.processes_inside(tmp_path) == []
    assert pod.poll() == -9


def test_entering_a_pod_outside_its_namespaces_refuses_to_touch_the_host(tmp_path):
    import sys

    spec = podspec.pod_specs([job_document(replicas=1)], IPS[:1])[0]
    spec_file = podsim.stage_pod(spec, tmp_path / spec.name)
    argv = podsim.pod_argv(spec_file)
    run = subprocess.run(
        argv[argv.index(sys.executable) :], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 126
    assert run.stderr.startswith(podspec.SETUP_FAILED) and "private mount namespace" in run.stderr
