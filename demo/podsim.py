"""The demo's pods as isolated local processes: namespaces, mounts, chroot (the simulator's edge).

:func:`stage_pod`, :func:`pod_argv`, :func:`start_pod`, :class:`PodProcess` and the ``enter`` step
run by ``python -m npu_job.demo.podsim enter SPEC`` start one :class:`~npu_job.demo.podspec.PodSpec`
(``podspec`` builds them from the rendered Job) with its own view of the machine, without root
where possible. The pod runs under ``unshare --mount --uts`` (plus ``--user --map-root-user``
when not root); inside, :func:`enter_pod` builds a new root on a tmpfs that bind-mounts the
host's top level, replaces ``/tmp`` with a private directory, ``/etc/hosts`` with the pod's hosts
file, mounts the volumes (a mount path that does not exist on the host gets a tmpfs "mirror" of
its parent that re-binds the parent's entries, so nothing on the host is touched), sets the
hostname, chroots and execs the container command with exactly the pod's environment. The host
IP is whatever the caller chose: a loopback address (all of 127/8 is local on Linux) or a
network-namespace address. The "image" is the pod spec's environment and its ``image_paths``
(:mod:`npu_job.demo.images` makes them): by default a stock python3 with torch and no npu-job;
or this installation (:func:`this_installation`), whose pods' PATH leads first to the running
interpreter and npu-job's console scripts, whatever the PATH of whoever started the pods.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from npu_job.errors import LaunchError
from npu_job.podfacts import PYTHON_ENV

from .podlog import attempt_header
from .podspec import SETUP_FAILED, PodSpec, hosts_file_text


def this_installation() -> Dict[str, str]:
    """The installed image's software, as environment: this Python and npu-job's console scripts.

    A pod runs npu-job's own code (the bootstrap runs ``python3``, train.sh runs ``npu-run``), so
    its PATH must lead to the directory of the running interpreter and to this installation's
    console scripts, however npu-job was started: by the absolute path of a virtualenv's
    ``npu-job`` from a shell whose PATH lacks the virtualenv (cron, CI), or through a pipx link
    whose virtualenv is never on PATH (where the machine's own ``python3`` cannot import npu_job).
    When that directory's ``python3`` is another interpreter, ``NPU_JOB_PYTHON`` (which
    bootstrap.sh honours) names this one.
    """
    import site
    import sysconfig

    here = os.path.dirname(sys.executable)  # not resolved: a virtualenv's python is a symlink
    dirs = [here, sysconfig.get_path("scripts")]
    package = os.path.dirname(os.path.abspath(__file__))
    if package.startswith(site.getusersitepackages() + os.sep):  # pip install --user
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    installation = {
        "PATH": os.pathsep.join(dict.fromkeys(d for d in dirs if d and os.path.isdir(d)))
    }
    python3 = os.path.join(here, "python3")
    if not (os.path.exists(python3) and os.path.samefile(python3, sys.executable)):
        installation[PYTHON_ENV] = sys.executable
    return installation


def unshare_unavailable_reason() -> Optional[str]:
    """Why pods cannot get their own mount namespace here, or None when they can."""
    if shutil.which("unshare") is None:
        return "the 'unshare' command (util-linux) is not installed"
    probe = subprocess.run(unshare_prefix() + ["true"], capture_output=True, text=True)
    if probe.returncode != 0:
        command = " ".join(unshare_prefix())
        return f"'{command} true' failed: {probe.stderr.strip() or probe.returncode}"
    return None


def unshare_prefix(user_namespace: Optional[bool] = None) -> List[str]:
    """``unshare ... --``; with a user namespace when not root (or when asked to)."""
    # A PID namespace makes the pod a container: when its first process dies (or ``unshare`` is
    # killed: --kill-child), the kernel kills every process left in it, workers that called
    # setsid() included, so a killed pod leaves nothing behind.
    prefix = [
        "unshare",
        "--mount",
        "--uts",
        "--pid",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
    ]
    if user_namespace if user_namespace is not None else os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    return prefix + ["--"]


def stage_pod(spec: PodSpec, directory: Path) -> Path:
    """Write the pod's private files under ``directory``; return the spec file to enter with."""
    from npu_job.fileio import write_atomic

    (directory / "tmp").mkdir(parents=True, exist_ok=True)
    (directory / "tmp").chmod(0o1777)
    (directory / "root").mkdir(exist_ok=True)
    write_atomic(directory / "hosts", hosts_file_text(spec))
    stage_volumes(spec, directory)
    for number, mount in enumerate(spec.host_mounts):
        if not mount.host_path:
            (directory / "emptydir" / str(number)).mkdir(parents=True, exist_ok=True)
    return write_atomic(directory / "pod.json", spec.to_json())


def stage_volumes(spec: PodSpec, directory: Path) -> None:
    """Write the files of the pod's volumes (ConfigMaps, what cluster plugins mount) as its spec
    holds them; each file is replaced whole, as the kubelet swaps a ConfigMap volume's files, so a
    running pod sees the new ones in a directory mount (a single-file mount from its next start)."""
    from npu_job.fileio import write_atomic

    for number, mount in enumerate(spec.file_mounts):
        target = directory / "volumes" / str(number)
        for relative, text in mount.files:
            # binaryData (the bundle) comes decoded with surrogateescape: back to its bytes
            data = text.encode("utf-8", "surrogateescape")
            write_atomic(target / relative, data, mode=mount.mode)


def staged_file(spec: PodSpec, directory: Path, path: str) -> Optional[Path]:
    """Where the file the pod sees at ``path`` is staged (None: no volume holds it)."""
    for number, mount in enumerate(spec.file_mounts):
        for relative, _ in mount.files:
            seen = mount.mount_path if mount.single_file else f"{mount.mount_path}/{relative}"
            if seen == path:
                return directory / "volumes" / str(number) / relative
    return None


def reset_pod_tmp(directory: Path) -> None:
    """A restarted container starts from its image again: its /tmp is empty."""
    shutil.rmtree(directory / "tmp", ignore_errors=True)
    (directory / "tmp").mkdir()
    (directory / "tmp").chmod(0o1777)


def pod_argv(
    spec_file: Path, prefix: Sequence[str] = (), user_namespace: Optional[bool] = None
) -> List[str]:
    """The command that starts a staged pod (``prefix`` e.g. ``ip netns exec NS``)."""
    return [
        *prefix,
        *unshare_prefix(user_namespace),
        sys.executable,
        "-m",
        "npu_job.demo.podsim",
        "enter",
        str(spec_file),
        os.readlink("/proc/self/ns/mnt"),
    ]


class PodProcess:
    """One running attempt of a pod's container, in its own process group."""

    def __init__(
        self, spec: PodSpec, directory: Path, process: subprocess.Popen, attempt: int
    ) -> None:
        self.spec = spec
        self.directory = directory
        self.process = process
        self.attempt = attempt
        self.started = time.monotonic()

    def poll(self) -> Optional[int]:
        return self.process.poll()

    def kill(self) -> None:
        """SIGKILL the pod (what a node failure looks like): unshare dies, so does its PID
        namespace."""
        kill_process_groups([self.process])


def kill_process_groups(processes: Sequence[subprocess.Popen], timeout: float = 10.0) -> None:
    """SIGKILL the process group of every process still running (each started with
    ``start_new_session``), then reap each, waiting at most ``timeout`` seconds for one."""
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def processes_inside(directory: Path) -> List[int]:
    """PIDs of live processes whose root is a pod root under ``directory`` (leak check)."""
    prefix = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                root = os.readlink(entry / "root")
            except OSError:
                continue
            if root.startswith(prefix):
                found.append(int(entry.name))
    return found


def start_pod(
    spec_file: Path,
    *,
    attempt: int = 0,
    prefix: Sequence[str] = (),
    log_file: Optional[Path] = None,
    user_namespace: Optional[bool] = None,
) -> PodProcess:
    """Start a staged pod; its stdout+stderr go to ``log_file`` (appended) or ``<dir>/pod.log``."""
    spec = PodSpec.from_json(spec_file.read_text())
    directory = spec_file.parent
    if attempt > 0:
        reset_pod_tmp(directory)
    target = log_file or directory / "pod.log"
    with open(target, "ab") as handle:
        handle.write(attempt_header(spec.name, attempt).encode())
        handle.flush()
        process = subprocess.Popen(
            pod_argv(spec_file, prefix, user_namespace),
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "")},
        )
    return PodProcess(spec, directory, process, attempt)


# -- inside the pod's namespaces (runs as root of its user namespace) -------------------------
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_MOVE, _MS_REC = 4096, 8192, 16384


def _mount(
    source: str, target: str, fstype: Optional[str], flags: int, data: Optional[str] = None
) -> None:
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    result = libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source or '-'} on {target}: {os.strerror(errno)}")


def software_under_tmp(tmp: str = "/tmp", image: Sequence[str] = ()) -> Tuple[str, ...]:
    """Directories of this Python, of npu-job itself and of the pod's ``image`` (its
    :attr:`~npu_job.demo.podspec.PodSpec.image_paths`) that live under ``tmp``, outermost only.

    A pod gets a private /tmp, which would hide a virtualenv, a checkout that happens to live
    there (CI clones often do) or a demo run's image; a real pod has its software in the image
    instead. These are bound read-only at the same paths inside the pod's /tmp, so the pod runs
    the same interpreter and the same npu-job code as the machine that starts it.
    """
    import importlib.util

    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, *image]
    for package in (
        "npu_job",
        "npu_job.bootstrap",
        "npu_job.launcher",
        "npu_job.render",
        "npu_job.scripts",
        "npu_job.examples",
    ):
        spec = importlib.util.find_spec(package)
        candidates.extend(spec.submodule_search_locations or () if spec else ())
    root = Path(tmp).resolve()
    inside = sorted(
        {
            resolved
            for resolved in (Path(c).resolve() for c in candidates if c and os.path.isdir(c))
            if root in resolved.parents
        }
    )
    outermost: List[Path] = []
    for path in inside:  # sorted, so a directory comes before everything under it
        if not any(kept in path.parents for kept in outermost):
            outermost.append(path)
    return tuple(str(path) for path in outermost)


def _placeholder(like: Path, at: Path) -> None:
    if like.is_dir() and not like.is_symlink():
        at.mkdir(exist_ok=True)
    else:
        at.touch(exist_ok=True)


class _RootBuilder:
    """A new root on a tmpfs; paths we created (and may add entries to) are tracked."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.owned = {root}
        self.stage = 0

    def populate(self, private_tmp: Path) -> None:
        _mount("tmpfs", str(self.root), "tmpfs", 0, "mode=755")
        for entry in sorted(Path("/").iterdir()):
            target = self.root / entry.name
            if entry.name == "tmp":
                target.mkdir(mode=0o1777)
                _mount(str(private_tmp), str(target), None, _MS_BIND)
                self.owned.add(target)  # the pod's own /tmp: add mount points in it directly
            elif entry.name == "proc":  # this pod's PID namespace, not the host's processes
                target.mkdir()
                _mount("proc", str(target), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            elif entry.is_symlink():
                os.symlink(os.readlink(entry), target)
            else:
                _placeholder(entry, target)
                _mount(str(entry), str(target), None, _MS_BIND | _MS_REC)

    def ensure(self, path: str, *, directory: bool) -> Path:
        """``root/path`` exists (creating it without touching the host); returns it."""
        current = self.root
        parts = [part for part in Path(path).parts if part != "/"]
        for position, part in enumerate(parts):
            following = current / part
            last = position == len(parts) - 1
            if following.is_symlink():
                if not last:  # follow it inside the pod's root, as the runtime would
                    link = os.readlink(following)
                    inside = "/" + str(current.relative_to(self.root))
                    resolved = Path(link) if os.path.isabs(link) else Path(inside) / link
                    rest = parts[position + 1 :]
                    return self.ensure(
                        os.path.normpath(str(resolved.joinpath(*rest))), directory=directory
                    )
                # the mount replaces the link itself (e.g. /etc/localtime ->
                # ../usr/share/zoneinfo/UTC)
                if current not in self.owned:
                    self._mirror(current)
                following.unlink()
            if not following.exists():
                if current not in self.owned:
                    self._mirror(current)
                if last and not directory:
                    following.touch()
                else:
                    following.mkdir()
                self.owned.add(following)
            current = following
        return current

    def _mirror(self, directory: Path) -> None:
        """Cover a host directory with a tmpfs that re-binds its entries, so we can add to it."""
        self.stage += 1
        stage = self.root / f".npu-job-stage-{self.stage}"
        stage.mkdir()
        _mount("tmpfs", str(stage), "tmpfs", 0, "mode=755")
        for entry in sorted(directory.iterdir()):
            target = stage / entry.name
            if entry.is_symlink():
                os.symlink(os.readlink(entry), target)
            else:
                _placeholder(entry, target)
                _mount(str(entry), str(target), None, _MS_BIND | _MS_REC)
        _mount(str(stage), str(directory), None, _MS_MOVE)
        stage.rmdir()
        self.owned.add(directory)

    def bind(self, source: Path, path: str, *, read_only: bool) -> None:
        target = self.ensure(path, directory=source.is_dir())
        _mount(str(source), str(target), None, _MS_BIND | _MS_REC)
        if read_only:
            _mount("", str(target), None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY)


def enter_pod(spec_file: Path, host_mount_namespace: str) -> None:
    """Inside fresh mount+UTS namespaces: build the pod's filesystem view, then exec its command."""
    import socket

    spec = PodSpec.from_json(spec_file.read_text())
    directory = spec_file.parent.resolve()
    if os.readlink("/proc/self/ns/mnt") == host_mount_namespace:
        # Never mount anything in the launching machine's namespace (pod_argv runs us under
        # unshare).
        raise LaunchError(
            "not inside a private mount namespace; refusing to touch the host's mounts"
        )
    builder = _RootBuilder(directory / "root")
    builder.populate(directory / "tmp")
    for path in software_under_tmp(image=spec.image_paths):
        builder.bind(Path(path), path, read_only=True)
    builder.bind(directory / "hosts", "/etc/hosts", read_only=True)
    for number, mount in enumerate(spec.file_mounts):
        staged = directory / "volumes" / str(number)
        source = staged / mount.files[0][0] if mount.single_file else staged
        if not mount.single_file:
            staged.mkdir(parents=True, exist_ok=True)
        builder.bind(source, mount.mount_path, read_only=mount.read_only)
    for number, host_mount in enumerate(spec.host_mounts):
        if host_mount.memory:
            _mount(
                "tmpfs",
                str(builder.ensure(host_mount.mount_path, directory=True)),
                "tmpfs",
                0,
                "mode=1777",
            )
            continue
        source = (
            Path(host_mount.host_path)
            if host_mount.host_path
            else directory / "emptydir" / str(number)
        )
        if not source.exists():  # a hostPath without a type: the runtime creates an empty directory
            source = directory / "emptydir" / f"missing-{number}"
            source.mkdir(parents=True, exist_ok=True)
        builder.bind(source, host_mount.mount_path, read_only=host_mount.read_only)
    builder.ensure(spec.working_dir, directory=True)
    socket.sethostname(spec.hostname or spec.name)
    os.chroot(builder.root)
    os.chdir(spec.working_dir)
    env = spec.env_dict()
    try:
        os.execvpe(spec.argv[0], list(spec.argv), env)
    except OSError as error:
        sys.stderr.write(f"podsim: {spec.name}: cannot run {spec.argv[0]!r}: {error.strerror}\n")
        os._exit(127)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] != "enter":
        sys.stderr.write(
            "usage: python -m npu_job.demo.podsim enter POD_JSON HOST_MNT_NS  (see pod_argv)\n"
        )
        return 2
    try:
        enter_pod(Path(args[1]), args[2])
    except (OSError, LaunchError) as error:
        sys.stderr.write(f"{SETUP_FAILED} {error}\n")
        return 126
    return 0  # not reached: enter_pod execs


if __name__ == "__main__":
    sys.exit(main())
