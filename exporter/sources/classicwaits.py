"""Mark where classic FSDP's compute stream waits for its all-gathers and gradient reductions.

Classic FSDP (``FullyShardedDataParallel``) issues its all-gathers on a stream of its own and
its gradient reductions on another; on a CUDA device the compute stream is made to wait for them
with ``wait_stream`` or ``wait_event``, never through ``Work.wait()``. The functions that hold
those waits (private module functions of ``torch.distributed.fsdp._runtime_utils``, found by
name) are marked whole: the rest of what they do runs on FSDP's streams or on the host.

- ``_pre_forward_unshard``: before a module's forward, the wait for its parameters' all-gather
  (issued there unless prefetched). ``FullyShardedDataParallel.forward`` looks it up in its own
  module, where it is replaced too.
- ``_pre_backward_hook``: before a module's backward, the wait for the all-gather of its
  parameters, freed after the forward. Marked only where it gathers (once per module and
  backward; never for a strategy that keeps the parameters whole).
- ``_post_backward_final_callback``: at the end of backward, the wait for the gradient
  reductions (and HSDP's all-reduces) still running: the step's exposed tail. Not marked where
  gradients accumulate without being reduced (``no_sync``).

FSDP binds the last two into the hooks it registers each forward, so a hook registered while
the marks were in place can run once after ``uninstrument()``: it then calls straight through.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..log import log
from .devicewaits import DeviceWaits
from .patching import patch_method, restore_method

__all__ = ["ClassicFsdp", "ClassicFsdpWaitTiming", "classic_fsdp"]

_RUNTIME = "torch.distributed.fsdp._runtime_utils"
_FRONT = "torch.distributed.fsdp.fully_sharded_data_parallel"
_UNSHARD = "_pre_forward_unshard"
_PRE_BACKWARD = "_pre_backward_hook"
_TAIL = "_post_backward_final_callback"


@dataclass(frozen=True)
class ClassicFsdp:
    """The modules whose functions the marks go around (tests pass stand-ins)."""

    #: Holds the three functions, and looks them up when FSDP registers its hooks.
    runtime: Any
    #: Where ``FullyShardedDataParallel.forward`` looks ``_pre_forward_unshard`` up.
    front: Any


def classic_fsdp() -> ClassicFsdp | None:
    """Return this torch's classic FSDP modules, None where they lack the names used here."""
    try:
        runtime = importlib.import_module(_RUNTIME)
        front = importlib.import_module(_FRONT)
    except ImportError:
        return None
    found = [getattr(runtime, n, None) for n in (_UNSHARD, _PRE_BACKWARD, _TAIL)]
    found.append(getattr(front, _UNSHARD, None))
    return ClassicFsdp(runtime, front) if all(callable(f) for f in found) else None


def _gathers_for_backward(handle: Any) -> bool:
    """Whether the pre-backward hook, called with ``handle``, waits for an all-gather."""
    if not handle or getattr(handle, "_ran_pre_backward_hook", False):
        return False  # no parameters, or the module's hook already ran in this backward
    # Unknown to a later torch: marked (a wait that is not there times nothing).
    return bool(getattr(handle, "_needs_pre_backward_unshard", True))


class ClassicFsdpWaitTiming:
    """Put :class:`~exporter.sources.devicewaits.DeviceWaits` marks around classic FSDP's waits.

    ``fsdp``: the modules (tests pass stand-ins); by default this torch's.
    ``instrument()``/``uninstrument()`` are idempotent, and restore only what still holds this
    instance's wrapper.
    """

    def __init__(self, device: DeviceWaits, fsdp: ClassicFsdp | None = None) -> None:
        self._device = device
        self._fsdp = fsdp
        self._patched: list[tuple[Any, str, tuple[Any, Any] | None]] = []

    def instrument(self) -> bool:
        """Wrap classic FSDP's waits; return whether they are (False: none in this torch)."""
        if self._patched:
            return True
        fsdp = self._fsdp if self._fsdp is not None else classic_fsdp()
        if fsdp is None:
            log.info(
                "ddp-exporter: no classic FSDP functions by the names used here in this "
                "torch: its waits are not timed on the device"
            )
            return False
        wraps = [
            (fsdp.front, _UNSHARD, self._wrap_unshard),
            (fsdp.runtime, _UNSHARD, self._wrap_unshard),
            (fsdp.runtime, _PRE_BACKWARD, self._wrap_pre_backward),
            (fsdp.runtime, _TAIL, self._wrap_tail),
        ]
        for owner, name, wrap in wraps:
            self._patched.append((owner, name, patch_method(owner, name, wrap)))
        return True

    def uninstrument(self) -> None:
        """Restore every wrapped name unless someone replaced it since; idempotent."""
        for owner, name, patched in reversed(self._patched):
            restore_method(owner, name, patched)
        self._patched.clear()

    def _wrapper(
        self, original: Any, name: str, waits: Callable[[tuple[Any, ...]], bool]
    ) -> Callable[..., Any]:
        """Return ``original`` marked whole where ``waits(args)`` says it makes the stream wait."""
        marked = self._device.marked(original, compute=False)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                # Not after uninstrument(): a hook registered before it may still call this.
                wait = bool(self._patched) and waits(args)
            except Exception:  # noqa: BLE001 - never in the way of FSDP
                wait = False
            return marked(*args, **kwargs) if wait else original(*args, **kwargs)

        wrapper.__name__ = name
        return wrapper

    def _wrap_unshard(self, original: Any) -> Any:
        # (state, handle): nothing to gather without a handle.
        return self._wrapper(original, _UNSHARD, lambda args: len(args) > 1 and bool(args[1]))

    def _wrap_pre_backward(self, original: Any) -> Any:
        # (state, module, handle, grad, ...)
        def waits(args: tuple[Any, ...]) -> bool:
            return len(args) > 2 and _gathers_for_backward(args[2])

        return self._wrapper(original, _PRE_BACKWARD, waits)

    def _wrap_tail(self, original: Any) -> Any:
        # (state, module): the reductions are waited for only where gradients were synchronised.
        def waits(args: tuple[Any, ...]) -> bool:
            return bool(args) and bool(getattr(args[0], "_sync_gradients", True))

        return self._wrapper(original, _TAIL, waits)
