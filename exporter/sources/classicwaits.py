"""Mark where classic FSDP's compute stream waits for its all-gathers and gradient reductions.

Classic FSDP (``FullyShardedDataParallel``) issues its all-gathers on a stream of its own and
its gradient reductions on another; on a CUDA device the compute stream is made to wait for them
with ``wait_stream`` or ``wait_event``, never through ``Work.wait()``. The functions that hold
those waits are private module functions of ``torch.distributed.fsdp._runtime_utils``, found by
name. A mark opens as one of them starts and closes as the first of FSDP's own calls that
follow the wait starts, so that what FSDP does next on the compute stream and on the host is
not counted as a wait:

- ``_pre_forward_unshard``: before a module's forward, the wait for its parameters' all-gather
  (issued there unless prefetched); closed by the prefetch of the next module's
  (``_prefetch_handle``). ``FullyShardedDataParallel.forward`` looks it up in its own module,
  where it is replaced too.
- ``_pre_backward_hook``: before a module's backward, the wait for the all-gather of its
  parameters (once per module and backward, wherever its output needs a gradient; a strategy
  that keeps the parameters whole gathers nothing, and its wait is empty); closed by the
  prefetch that follows, before the gradient is prepared.
- ``_post_backward_final_callback``: at the end of backward, the wait for the gradient
  reductions (and HSDP's all-reduces) still running: the step's exposed tail. Closed as the
  first module is resharded and its gradients finalised (``_catch_all_reshard``). Not marked
  where gradients accumulate without being reduced (``no_sync``).

The compute stream waits for everything FSDP queued on the stream it waits for: beside the
collectives, mixed precision's casts, the gradient divides and accumulation, and with CPU
offload the copies between host and device (the end of backward synchronises the host there).
Where a torch lacks the closing function, a mark closes as its function returns.

FSDP binds the hook into the partial it registers each forward, and the callback into the one
it queues during backward, so either can run once after ``uninstrument()``: it then calls
straight through.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..log import log
from .devicewaits import DeviceWaits
from .patching import MethodPatches

__all__ = ["ClassicFsdp", "ClassicFsdpWaitTiming", "classic_fsdp"]

_RUNTIME = "torch.distributed.fsdp._runtime_utils"
_FRONT = "torch.distributed.fsdp.fully_sharded_data_parallel"
_UNSHARD = "_pre_forward_unshard"
_PRE_BACKWARD = "_pre_backward_hook"
_TAIL = "_post_backward_final_callback"
#: FSDP's calls that follow the waits: the marks close as they start.
_PREFETCH = "_prefetch_handle"
_RESHARD = "_catch_all_reshard"


@dataclass(frozen=True)
class ClassicFsdp:
    """The modules whose functions the marks go around (tests pass stand-ins)."""

    #: Holds the functions, and looks them up when FSDP calls them or registers its hooks.
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


def _forward_waits(args: tuple[Any, ...]) -> bool:
    return len(args) > 1 and bool(args[1])  # (state, handle): nothing to gather without one


def _backward_waits(args: tuple[Any, ...]) -> bool:
    return len(args) > 2 and _gathers_for_backward(args[2])  # (state, module, handle, grad)


def _tail_waits(args: tuple[Any, ...]) -> bool:
    # (state, module): the reductions are waited for only where gradients were synchronised.
    return bool(args) and bool(getattr(args[0], "_sync_gradients", True))


class ClassicFsdpWaitTiming:
    """Put :class:`~exporter.sources.devicewaits.DeviceWaits` marks around classic FSDP's waits.

    ``fsdp``: the modules (tests pass stand-ins); by default this torch's.
    ``instrument()``/``uninstrument()`` are idempotent, and restore only what still holds this
    instance's wrapper.
    """

    def __init__(self, device: DeviceWaits, fsdp: ClassicFsdp | None = None) -> None:
        self._device = device
        self._fsdp = fsdp
        self._patched = MethodPatches()
        # Per thread (backward runs on autograd's): the mark open until FSDP's next call.
        self._local = threading.local()

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
        wraps: list[tuple[Any, str, Callable[[Any], Any]]] = [
            (fsdp.front, _UNSHARD, self._opening(_UNSHARD, _forward_waits)),
            (fsdp.runtime, _UNSHARD, self._opening(_UNSHARD, _forward_waits)),
            (fsdp.runtime, _PRE_BACKWARD, self._opening(_PRE_BACKWARD, _backward_waits)),
            (fsdp.runtime, _TAIL, self._opening(_TAIL, _tail_waits)),
        ]
        for name in (_PREFETCH, _RESHARD):
            if callable(getattr(fsdp.runtime, name, None)):
                wraps.append((fsdp.runtime, name, self._closing(name)))
        self._patched.apply(wraps)
        return True

    def uninstrument(self) -> None:
        """Restore every wrapped name unless someone replaced it since; idempotent."""
        self._patched.restore()

    def _close(self) -> None:
        """Close this thread's open mark, if any: the wait it covers is over."""
        mark, self._local.mark = getattr(self._local, "mark", None), None
        if mark is not None:
            self._device.end(mark)

    def _opening(self, name: str, waits: Callable[[tuple[Any, ...]], bool]) -> Callable[[Any], Any]:
        """Return what wraps ``name``: a mark opened where ``waits(args)`` says it waits."""
        device, local = self._device, self._local

        def wrap(original: Any) -> Any:
            def opening(*args: Any, **kwargs: Any) -> Any:
                if not device.sampled() or getattr(local, "mark", None) is not None:
                    return original(*args, **kwargs)  # most steps: nothing more to ask
                try:
                    # Not after uninstrument(): a hook bound before it may still call this.
                    wait = bool(self._patched) and waits(args)
                except Exception:  # noqa: BLE001 - never in the way of FSDP
                    wait = False
                if not wait:
                    return original(*args, **kwargs)
                local.mark = device.begin()
                try:
                    return original(*args, **kwargs)
                finally:
                    self._close()  # where nothing closed it inside

            opening.__name__ = name
            return opening

        return wrap

    def _closing(self, name: str) -> Callable[[Any], Any]:
        """Return what wraps ``name``, one of FSDP's calls after a wait: it closes the mark."""
        local = self._local

        def wrap(original: Any) -> Any:
            def closing(*args: Any, **kwargs: Any) -> Any:
                if getattr(local, "mark", None) is not None:
                    self._close()
                return original(*args, **kwargs)

            closing.__name__ = name
            return closing

        return wrap
