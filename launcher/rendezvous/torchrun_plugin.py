"""The ``torchrun.handlers`` entry point: lets plain ``torchrun --rdzv_backend=parallel`` work.

torch's rendezvous registry loads this entry point while ``torch.distributed.elastic.rendezvous``
is being imported, which is also while :mod:`.handler` imports it. So this module imports
nothing of torch or of the backend at load time: pointing the entry point at the backend module
itself re-entered it half-imported and logged a warning with a traceback.
"""

from __future__ import annotations

from typing import Any, Callable


def create_handler(params: Any) -> Any:
    """Create the ``parallel`` handler (imports the backend on first use)."""
    from .handler import create_handler as create

    return create(params)


def torchrun_handler() -> Callable[[Any], Any]:
    """What the registry calls to get the handler factory (torch's entry-point convention)."""
    return create_handler
