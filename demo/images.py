"""What software a simulated pod's image holds (the edge): ``npu-job demo --image``.

A pod of the demo sees this machine's filesystem, so its "image" is what its environment leads
to: the PATH its container starts with and the interpreters there. :func:`make_image` builds one
of :data:`IMAGES` for a run, under the run's work directory, and checks that it is what it
claims:

* ``stock`` (the default: what users meet): a ``python3`` with torch and without npu-job, and no
  npu-job console scripts on PATH. The pods run npu-job only from the job's bundle
  (``npu-job.pyz`` in the scripts ConfigMap); without it the bootstrap finds no ``npu_job`` and
  train.sh stops. See :func:`stock_image`.
* ``stock-py37``: the same, except that the image's ``python3`` is CPython 3.7 without torch and
  the torch interpreter is named by ``NPU_JOB_LAUNCHER_PYTHON``. See :func:`stock_py37_image`.
* ``installed``: this installation (:func:`npu_job.demo.podsim.this_installation`): the running
  interpreter and npu-job's console scripts lead the pod's PATH, followed by the caller's PATH.
  The bundle still wins over it in the pods; this is the image of a job rendered with
  ``bundle: false``.

:func:`find_interpreter` finds a CPython of a given version on this machine (``python3.X`` on
PATH, else under pyenv); the tests of the oldest Python use it too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from npu_job.errors import LaunchError
from npu_job.podfacts import LAUNCHER_PYTHON_ENV

from .podspec import IMAGE_PATH, image_environment
from .scenario import IMAGES, INSTALLED_IMAGE, STOCK_IMAGE, STOCK_PY37_IMAGE

PY37 = (3, 7)  # the oldest python3 of the images the platform's routing supports
NPU_JOB_COMMANDS = ("npu-job", "npu-run")  # console scripts a stock image must not have
_NO_IMAGE_TIP = "run the demo with --image installed (the pods' image is then this installation)"

# What a pod's Python prints about itself: its version, whether torch and npu_job are importable.
# Run with the image's environment from the image's directory, not the caller's (which may hold
# an npu_job package); the image's own entries have names no import can find (torch-python).
_PROBE = (
    "import importlib.util as u, sys; "
    "print('%d.%d' % sys.version_info[:2], u.find_spec('torch') is not None, "
    "u.find_spec('npu_job') is not None)"
)


@dataclass(frozen=True)
class Image:
    """A simulated pod image: the environment its container starts with and where it lives."""

    name: str
    env: Dict[str, str]  # the image's ENV (PATH included), before the pod spec's env
    paths: Tuple[str, ...] = ()  # host directories holding it (a pod must see them at that path)
    description: str = ""  # what it holds, for the run's progress lines


def find_interpreter(version: Tuple[int, int], *, probe: bool = True) -> Optional[str]:
    """A CPython ``version`` on this machine: ``python3.X`` on PATH, else pyenv's newest
    ``X.Y.*``; None when there is none. ``probe``: only one that runs (else: one that exists)."""
    name = f"python{version[0]}.{version[1]}"
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [shutil.which(name)] + sorted(
        (str(path) for path in root.glob(f"{version[0]}.{version[1]}.*/bin/{name}")),
        reverse=True,
    )
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        if (
            not probe
            or subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0
        ):
            return candidate
    return None


def offered_images() -> Tuple[str, ...]:
    """The images this machine can make (``stock-py37`` needs a CPython 3.7), without running
    anything: what ``npu-job demo --image`` offers."""
    return tuple(
        name
        for name in IMAGES
        if name != STOCK_PY37_IMAGE or find_interpreter(PY37, probe=False) is not None
    )


def make_image(name: str, directory: Path, environ: Mapping[str, str]) -> Image:
    """Image ``name`` of :data:`IMAGES` for the pods of one run, built under ``directory`` when it
    needs files; ``environ`` is the environment of whoever started the run. LaunchError (with a
    tip) when this machine cannot make it."""
    from . import podsim

    if name == INSTALLED_IMAGE:
        installation = podsim.this_installation()
        return Image(
            INSTALLED_IMAGE,
            image_environment(environ, installation),
            description=f"this installation (PATH {installation.get('PATH', '')} first)",
        )
    if name == STOCK_IMAGE:
        return stock_image(directory, environ)
    if name == STOCK_PY37_IMAGE:
        return stock_py37_image(directory, environ)
    raise ValueError(f"image must be one of {', '.join(IMAGES)}, got {name!r}")


def stock_image(directory: Path, environ: Mapping[str, str]) -> Image:
    """A stock training image: ``python3`` with torch, without npu-job.

    ``python3`` is a virtualenv of the running interpreter (no pip) whose site-packages links
    every entry of this interpreter's site-packages but npu-job's own: torch and what else is
    installed here import as they do for the caller, ``npu_job`` does not, whether npu-job is
    installed editable (a finder ``.pth``) or from a wheel (a package directory). Its ``bin`` leads
    the pod's PATH, followed by an image's usual PATH (not the caller's, which may hold npu-job's
    console scripts); the caller's ``PYTHON*`` variables stay out.
    """
    python = python_without_npu_job(directory / "torch-python")
    image = Image(
        STOCK_IMAGE, _stock_environment(environ, str(Path(python).parent)), (str(directory),)
    )
    version, torch, npu_job = _probe(image, "python3")
    if not torch or npu_job:
        raise _cannot_make(image, f"its python3 ({version}) should import torch and not npu_job")
    return replace(image, description=f"python3 {version} with torch, no npu-job ({python})")


def stock_py37_image(directory: Path, environ: Mapping[str, str]) -> Image:
    """A stock image whose ``python3`` is CPython 3.7, torch in another interpreter.

    This is how CANN training images tend to come: the operating system's ``python3`` is 3.7
    (what the platform's routing guide runs ``bootstrap.sh`` with), and torch/torch_npu live in a
    separately installed interpreter, which the job names for the launcher with
    ``NPU_JOB_LAUNCHER_PYTHON``. So here the bootstrap runs the bundle on 3.7 (PATH's
    ``python3``) and npu-run and the workers on the torch interpreter of :func:`stock_image`
    (off PATH), named by ``NPU_JOB_LAUNCHER_PYTHON`` in the image's ENV. The other way round (torch
    as ``python3``, 3.7 by ``NPU_JOB_PYTHON``) would test a setting no image needs.
    """
    py37 = find_interpreter(PY37)
    if py37 is None:
        raise LaunchError(
            f"cannot make the {STOCK_PY37_IMAGE} image: no CPython 3.7 on this machine "
            "(python3.7 on PATH or under pyenv)",
            tip=f"install one (pyenv install 3.7) or run the demo with --image {STOCK_IMAGE}",
        )
    torch_python = python_without_npu_job(directory / "torch-python")
    bin_dir = directory / "python-3.7" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if not (bin_dir / "python3").is_symlink():
        (bin_dir / "python3").symlink_to(py37)
    env = _stock_environment(environ, str(bin_dir))
    env[LAUNCHER_PYTHON_ENV] = torch_python
    image = Image(STOCK_PY37_IMAGE, env, (str(directory),))
    version, _, npu_job = _probe(image, "python3")
    if version != "3.7" or npu_job:
        raise _cannot_make(image, f"its python3 ({py37}) should be 3.7 without npu_job")
    torch_version, torch, npu_job = _probe(image, torch_python)
    if not torch or npu_job:
        raise _cannot_make(image, f"{torch_python} should import torch and not npu_job")
    return replace(
        image,
        description=f"python3 3.7 ({py37}), torch in python {torch_version} named by "
        f"{LAUNCHER_PYTHON_ENV} ({torch_python}), no npu-job",
    )


def python_without_npu_job(venv: Path) -> str:
    """A virtualenv at ``venv`` of the running interpreter whose site-packages links everything
    in this interpreter's site-packages but npu-job (its modules, metadata and finder, so torch
    sees no ``torchrun.handlers`` entry point of it either); its ``python3`` (built once per
    directory). The demo's stock images and the launcher tests' stock Python are this one."""
    import venv as venvs

    python = venv / "bin" / "python3"
    if python.exists():
        return str(python)
    venvs.EnvBuilder(with_pip=False, symlinks=True).create(str(venv))
    site = next(venv.glob("lib/python*/site-packages"))
    for source in _site_directories():
        for entry in sorted(Path(source).iterdir()):
            link = site / entry.name
            # the first directory holding a name wins, as it does on sys.path
            if not _is_npu_job(entry.name) and not os.path.lexists(link):
                link.symlink_to(entry)
    return str(python)


def _site_directories() -> List[str]:
    """This interpreter's site-packages directories, in the order site adds them."""
    import site
    import sysconfig

    found = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return [path for path in dict.fromkeys(found) if path and os.path.isdir(path)]


def _is_npu_job(name: str) -> bool:
    """An entry of site-packages that is npu-job's: its package, metadata, editable finder or
    ``.pth``, egg-link."""
    normal = name.lower().replace("-", "_").lstrip("_")
    return normal.startswith(("npu_job", "editable__.npu_job", "editable___npu_job"))


def _stock_environment(environ: Mapping[str, str], bin_dir: str) -> Dict[str, str]:
    usual = {
        key: value
        for key, value in environ.items()
        if not key.startswith("PYTHON") and key != "VIRTUAL_ENV"
    }
    usual["PATH"] = IMAGE_PATH
    return image_environment(usual, {"PATH": bin_dir})


def _probe(image: Image, python: str) -> Tuple[str, bool, bool]:
    """(version, torch importable, npu_job importable) of ``python`` in ``image``; raises when
    the image's PATH holds npu-job's commands or ``python`` does not run."""
    path = image.env["PATH"]
    commands = [name for name in NPU_JOB_COMMANDS if shutil.which(name, path=path)]
    if commands:
        raise _cannot_make(image, f"{', '.join(commands)} on its PATH ({path})")
    executable = shutil.which(python, path=path) if os.sep not in python else python
    if executable is None:
        raise _cannot_make(image, f"no {python} on its PATH ({path})")
    run = subprocess.run(
        [executable, "-c", _PROBE],
        env=image.env,
        cwd=image.paths[0] if image.paths else None,
        capture_output=True,
        text=True,
    )
    words = run.stdout.split()
    if run.returncode != 0 or len(words) != 3:
        raise _cannot_make(image, f"{executable} does not run: {run.stderr.strip()[-300:]}")
    return words[0], words[1] == "True", words[2] == "True"


def _cannot_make(image: Image, why: str) -> LaunchError:
    return LaunchError(
        f"cannot make the {image.name} image for the demo's pods: {why}", tip=(_NO_IMAGE_TIP)
    )
