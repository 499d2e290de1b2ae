"""Workers die with their agent: a parent-death signal set before the worker's command starts.

torch starts every worker in a session of its own, so a SIGKILLed agent (OOM killer, a node
being drained, ``kill -9``) leaves its workers training on, holding their ports and their peers'
collectives. Linux can tie a child to its parent: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the
kernel kill the process when the thread that forked it ends, and the setting survives ``exec``.
torch offers no hook between its fork and its exec, so npu-run starts each worker through this
file: ``python -I -S -c <run this file> --parent=PID <torch's worker arguments>`` sets the
signal, checks that the agent did not die in between, and ``exec``s the real command, which then
is the worker (same pid, same environment, same arguments).

The wrapper's interpreter starts isolated and without ``site`` (this file needs only the
standard library): that start costs a fraction of a full one, which the worker pays anyway.
Every argument before the worker's own starts with ``-`` (the ``-c`` code too), so that torch
still names the script (it reports the first argument that does not) in its failure summary.
Off Linux the wrapper only ``exec``s.

``--run-path`` is no command: torchrun then hands its agent a function (torch's
``run_script_path``, ``runpy.run_path`` of the script), which torch's agent runs in a process
its ``--start-method`` makes (spawn by default), under ``@record``. torch gives that process
SIGINT as its parent-death signal, which a worker stuck in C code (a collective whose peer is
gone) never acts on. npu-run keeps torch's way and puts :func:`run_script_path` in front of
torch's function: it sets SIGKILL instead, checks that the agent still lives, and calls it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# No typing import (nor anything else the wrapper's start would pay for): annotations stay text.


def launch() -> "tuple[str, ...]":
    """The interpreter flags that run this file's code as ``__main__``.

    "-0 or ...": code that starts with "-" (see the module docstring). From an installed package
    the code runs this very file; from the job's bundle (a zip archive, which ``open`` cannot read
    into) it carries the file's source itself.
    """
    if os.path.isfile(__file__):
        code = f"open({__file__!r}).read()"
    else:
        code = repr(__loader__.get_source(__name__))  # type: ignore[name-defined]  # noqa: F821
    return (
        "-I",
        "-S",
        "-c",
        f"-0 or exec(compile({code}, {__file__!r}, 'exec'), "
        f"{{'__name__': '__main__', '__file__': {__file__!r}}})",
    )


PARENT_FLAG = "--parent="
EXEC_FLAG = "--exec="
PR_SET_PDEATHSIG = 1
EXIT_ORPHANED = 137  # as if the signal had come: 128 + SIGKILL


def wrap(entrypoint: "str | Callable", args: "Sequence[str]", parent_pid: int) -> "tuple":
    """torch's worker command ``entrypoint args`` behind the wrapper, for agent ``parent_pid``.

    A function (``--run-path``: torch's ``run_script_path``) is put behind :func:`run_script_path`
    instead: ``(run_script_path, [parent_pid, torch's function, *args])``.
    """
    if callable(entrypoint):
        return run_script_path, [str(parent_pid), entrypoint, *args]
    head = [*launch(), f"{PARENT_FLAG}{parent_pid}"]
    if entrypoint != sys.executable:  # --no_python: a program of its own
        head.append(f"{EXEC_FLAG}{entrypoint}")
    return sys.executable, [*head, *args]


def set_parent_death_signal(signum: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``signum`` when our parent thread ends (False where unsupported)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def _orphaned(parent: int) -> bool:
    """The agent ``parent`` died before the signal was armed (its child is now another's).

    Under ``--start-method=forkserver`` the worker's parent is torch's fork server, not the agent:
    the signal then ties it to the server, which ends with the agent; the agent is looked up by
    its pid instead.
    """
    if os.getppid() == parent:
        return False
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's: not the agent, whose child we are
        return True
    return False


def run_script_path(parent: str, function: "Callable", *args: str) -> object:
    """``--run-path``'s worker: the parent-death signal, then torch's ``function(*args)``.

    Its name is torch's, which torch's failure summary shows, as under torchrun.
    """
    set_parent_death_signal()
    if _orphaned(int(parent)):
        os._exit(EXIT_ORPHANED)
    return function(*args)


def parse(argv: "Sequence[str]") -> "tuple[int, str | None, list[str]]":
    """``(parent pid, program or None for this Python, arguments)`` from the wrapper's argv."""
    rest = list(argv)
    parent = program = None
    while rest and rest[0].startswith((PARENT_FLAG, EXEC_FLAG)):
        flag = rest.pop(0)
        if flag.startswith(PARENT_FLAG):
            parent = int(flag[len(PARENT_FLAG) :])
        else:
            program = flag[len(EXEC_FLAG) :]
    if parent is None:
        raise SystemExit(f"{__file__}: expected {PARENT_FLAG}PID first, got {list(argv)!r}")
    return parent, program, rest


def main(argv: "Sequence[str] | None" = None) -> "NoReturn":
    parent, program, args = parse(sys.argv[1:] if argv is None else argv)
    set_parent_death_signal()
    if os.getppid() != parent:  # the agent died before the signal was armed
        os._exit(EXIT_ORPHANED)
    if program is None:
        os.execv(sys.executable, [sys.executable, *args])
    os.execvp(program, [program, *args])


if __name__ == "__main__":
    main()
