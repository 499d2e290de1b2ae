"""Atomic file writes: the one way npu-job puts files on disk.

A reader (another pod step, ``source``-ing shell, kubectl) must never see a half-written file, and a
failed run must never clobber a good one, so every write goes to a temporary file in the target's
directory and is then renamed over the target. By default the data is fsync'ed before the rename,
so the file also survives a machine crash; ``durable=False`` skips that for scratch outputs that
die with their container anyway (the rename alone keeps readers from seeing partial data).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


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
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target
