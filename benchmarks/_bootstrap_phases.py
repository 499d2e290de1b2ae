"""One bootstrap run cut into phases for callgrind: ``bench_bootstrap_api.py --callgrind``.

Run with a pod's environment under ``valgrind --tool=callgrind --dump-before=zlib_adler32``, it
runs the bootstrap as ``scripts/bootstrap.sh`` does (the cyclic GC off,
``npu_job.bootstrap.command.main``, ``os._exit``) and calls ``zlib.adler32`` at every boundary
between phases, so that callgrind writes the instructions of each phase to a profile of its own.
The bootstrap itself never calls ``zlib.adler32``; the benchmark checks that the profiles and the
boundaries agree in number. The phases' names go to stdout, one line per boundary, in order: the
profile written at boundary ``k`` holds the instructions run under the ``k``-th name; the last
name holds those after the last boundary (``main`` has returned: nearly none).

A phase is the innermost of the wrapped calls below that is running; what runs outside all of
them is ``the rest``. The modules the bootstrap imports lazily are imported before ``main`` here
(to be wrapped), so their loading counts under ``start-up and imports``, not under the phase that
first needs them; ``http.client``, ``ssl`` and msgspec still load inside ``reading the pods``.
"""

from __future__ import annotations

import gc
import os
import sys
from importlib import import_module
from typing import Any, Callable, List

from _phase_marks import Phases

gc.disable()  # as bootstrap.sh runs
phases = Phases("start-up and imports")
boundary = phases.begin


from npu_job.bootstrap import run as bootstrap_run  # noqa: E402
from npu_job.bootstrap.command import main  # noqa: E402

# (module, attribute, phase); a method as "Class.method"
PHASES = (
    ("npu_job.bootstrap.podrun", "load_job", "the roster"),
    ("npu_job.bootstrap.kubeapi", "KubeClient.list_pods", "reading the pods"),
    ("npu_job.bootstrap.podrun", "job_topology", "the topology"),
    ("npu_job.bootstrap.run", "_plan", "the plan"),
    ("npu_job.bootstrap.writers", "write_plan_outputs", "the files"),
)
running: List[str] = ["the rest"]


def wrapped(function: Callable[..., Any], phase: str) -> Callable[..., Any]:
    def phase_of(*args: Any, **kwargs: Any) -> Any:
        running.append(phase)
        boundary(phase)
        try:
            return function(*args, **kwargs)
        finally:
            running.pop()
            boundary(running[-1])

    return phase_of


for module_name, attribute, phase in PHASES:
    owner: Any = import_module(module_name)
    *classes, name = attribute.split(".")
    for class_name in classes:
        owner = getattr(owner, class_name)
    setattr(owner, name, wrapped(getattr(owner, name), phase))

boundary("the rest")
bootstrap_run.KEEP_UNTIL_EXIT = []  # as bootstrap.sh: freed by os._exit
code = main(sys.argv[1:])
boundary("the rest")
phases.write()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
