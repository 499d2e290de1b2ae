"""Atomic file writes: the one way npu-job puts files on disk.

A reader (another pod step, ``source``-ing shell, kubectl) must never see a half-written file, and a
failed run must never clobber a good one, so every write goes to a temporary file in the target's
directory and is then renamed over the target. By default the data is fsync'ed before the rename,
so the file also survives a machine crash; ``durable=False`` skips that for scratch outputs that
die with their container anyway (the rename alone keeps readers from seeing partial data).
:func:`write_files_atomic` does the same for a set of files that belong together (``npu-job
render --output-dir``): all are written before any is renamed into place.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import List, Sequence, Tuple, Union


def write_atomic(
    path: Union[str, os.PathLike],
    data: Union[str, bytes],
    mode: int = 0o644,
    *,
    durable: bool = True,
) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + rename) and return the path.

    Text is encoded as UTF-8. Parent directories are created. The file gets ``mode``. With
    ``durable`` (the default) the data reaches the disk before the rename.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_copy(target, data, mode, durable)
    try:
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return target


def write_files_atomic(
    directory: Union[str, os.PathLike],
    files: Sequence[Tuple[str, Union[str, bytes], int]],
    *,
    durable: bool = True,
) -> List[Path]:
    """Write ``files`` (name, data, mode) into ``directory``: all of them, or none.

    Every file is written to a temporary file first; only when all are written are they renamed
    over their targets, and a target that is a directory fails before any rename. On failure the
    temporary files and the directories this call created are removed, and the ``OSError`` (its
    ``filename`` says which path) is raised. Returns the paths in the order given.
    """
    folder = Path(directory)
    missing = []  # directories this call creates, deepest first
    probe = folder
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    temps: List[str] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        targets = [folder / name for name, _, _ in files]
        for target in targets:
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
        for target, (_, data, mode) in zip(targets, files):
            temps.append(_temp_copy(target, data, mode, durable))
        for tmp, target in zip(temps, targets):
            os.replace(tmp, target)
    except BaseException:
        for tmp in temps:
            _unlink_quietly(tmp)
        for created in missing:
            try:
                created.rmdir()
            except OSError:
                pass
        raise
    return targets


def _temp_copy(target: Path, data: Union[str, bytes], mode: int, durable: bool) -> str:
    """A temporary file beside ``target`` holding ``data`` with ``mode``; its path."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _create_temp(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


# tempfile.mkstemp's flags. tempfile itself is not imported: it loads shutil, and shutil bz2 and
# lzma, 6.7 M instructions of a pod's start-up (the bootstrap's budget) for one random name.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_CREATE |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_NAME_TRIES = 100


def _create_temp(target: Path) -> Tuple[int, str]:
    """``tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")``: a new
    file (mode 0600, created exclusively) under a random name beside ``target``."""
    for _ in range(_NAME_TRIES):
        path = os.path.join(target.parent, f".{target.name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(path, _CREATE, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", str(target.parent))


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
