"""How many workers ``--nproc_per_node`` means on this node (``auto``, ``npu``, ``gpu``, ``cpu``,
N).

torchrun's ``auto`` only knows the accelerator torch has loaded; Ascend's ``torch_npu`` registers
itself only once imported, so a plain torchrun on an NPU node counts CPUs. ``npu-run`` imports
``torch_npu`` lazily (only for ``auto``/``npu``) and guarded (a broken or absent ``torch_npu`` is
"no NPUs", not a crash), then picks NPUs, else torchrun's own choice: the devices of
``torch.accelerator`` when it has one available (CUDA, XPU, MPS, a custom backend: torch 2.6+),
else, on a torch without ``torch.accelerator``, CUDA GPUs; else CPUs (those this process may
use, where torchrun counts the host's).

The choice itself is pure (:func:`resolve_nproc_per_node` takes a :class:`DeviceCounts`, which
holds what torch answered, so every case is tested with values: no test machine has an XPU);
:func:`probe_devices` is the edge that asks torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Tuple

from npu_job.errors import LaunchError
from npu_job.parsing import is_count

from .cpus import usable_cpus

logger = logging.getLogger(__name__)

DEVICE_KINDS = ("auto", "npu", "gpu", "cpu")


@dataclass(frozen=True)
class DeviceCounts:
    """Devices visible on this node (0 when the kind is absent or its runtime is missing).

    ``accelerator`` is ``torch.accelerator``'s answer: the type of the accelerator available
    (``"cuda"``, ``"xpu"``, ...) and its device count, or ``("", 0)`` when none is available or
    torch has no ``torch.accelerator`` (before 2.6).
    """

    npu: int
    gpu: int
    cpu: int
    accelerator: Tuple[str, int] = ("", 0)


def resolve_nproc_per_node(value: str, counts: Callable[[], DeviceCounts]) -> Tuple[int, str]:
    """``(workers, device kind)`` for a ``--nproc_per_node`` value.

    ``counts`` is only called for the named kinds, so ``--nproc_per_node=8`` never imports
    ``torch_npu``. Raises :class:`LaunchError` for a kind this node does not have.
    """
    text = value.strip()
    if is_count(text):
        if int(text) < 1:
            raise LaunchError(f"--nproc_per_node: expected at least 1 worker, got {value!r}")
        return int(text), "fixed"
    kind = text.lower()
    if kind not in DEVICE_KINDS:
        raise LaunchError(
            f"--nproc_per_node: expected a positive integer or one of {', '.join(DEVICE_KINDS)}, "
            f"got {value!r}"
        )
    found = counts()
    if kind == "auto":
        accelerator, devices = found.accelerator
        if found.npu > 0:
            return found.npu, "npu"
        if devices > 0:  # torchrun's auto: whatever accelerator torch has
            return devices, "gpu" if accelerator == "cuda" else accelerator
        if found.gpu > 0:
            return found.gpu, "gpu"
        return max(found.cpu, 1), "cpu"
    number = getattr(found, kind)
    if number < 1:
        hint = (
            "torch_npu is not importable or sees no NPU"
            if kind == "npu"
            else ("torch.cuda sees no GPU" if kind == "gpu" else "no CPU is usable")
        )
        raise LaunchError(f"--nproc_per_node={kind}: this node has no {kind.upper()} ({hint})")
    return number, kind


def _count_npus() -> int:
    try:
        import torch  # noqa: F401  (torch_npu patches torch on import)
        import torch_npu  # type: ignore[import-not-found]  # noqa: F401
    except Exception as error:  # absent, or an install that fails to load: treat as no NPU
        logger.debug("torch_npu not usable (%s): counting no NPUs", error)
        return 0
    import torch

    npu = getattr(torch, "npu", None)
    try:
        return int(npu.device_count()) if npu is not None and npu.is_available() else 0
    except Exception as error:  # driver present but broken
        logger.warning("torch_npu is installed but cannot count NPUs: %s", error)
        return 0


def _count_gpus() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def probe_devices() -> DeviceCounts:
    """Count this node's NPUs, GPUs, usable CPUs (its quota counted: :mod:`.cpus`) and the
    accelerator torch reports (imports torch, and torch_npu if present)."""
    from .torchcompat import accelerator_devices

    npus = _count_npus()  # first: torch_npu registers its accelerator with torch on import
    return DeviceCounts(
        npu=npus, gpu=_count_gpus(), cpu=usable_cpus(), accelerator=accelerator_devices()
    )
