"""Hiding an optional accelerator from a benchmark's child processes, as an image without it.

``hidden(...)`` returns an environment in which ``import NAME`` fails: a package of that name that
raises ImportError, first on PYTHONPATH. The bootstrap then takes the standard library's path,
so one run can time both paths side by side.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict


def hidden(package: str, directory: Path, env: Dict[str, str]) -> Dict[str, str]:
    """``env`` with ``import package`` failing (``directory`` holds the stand-in package)."""
    stand_in = directory / package
    stand_in.mkdir(parents=True, exist_ok=True)
    (stand_in / "__init__.py").write_text(
        f'raise ImportError("{package} hidden by a benchmark to time the path without it")\n'
    )
    path = os.pathsep.join(filter(None, [str(directory), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path}
