"""Atomic file writes: the one way npu-job puts files on disk.

A reader (another pod step, ``source``-ing shell, kubectl) must never see a half-written file, and a
failed run must never clobber a good one, so every write goes to a temporary file in the target's
directory, is flushed and fsync'ed, then renamed over the target.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


def write_atomic(path: Union[str, os.PathLike], data: Union[str, bytes], mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + rename) and return the path.

    Text is encoded as UTF-8. Parent directories are created. The file gets ``mode``.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
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
