"""Mark where FSDP2's compute stream waits for its all-gathers and its reduce-scatters.

FSDP2 (``fully_shard``) issues its all-gathers and reduce-scatters on streams of its own; on a
CUDA device the compute stream is made to wait for them with events, never through
``Work.wait()``. Its methods that hold those waits (torch >= 2.4, private, found by name in
either of the modules FSDP2 has lived in) are marked:

- ``FSDPParamGroup.wait_for_unshard``: before a group's forward or backward, its parameters'
  all-gather. The part waits for the all-gather's event itself, between its two marks, before
  FSDP2 does: the copy-out that follows is compute, not a wait. (FSDP2's second wait for the
  same event orders nothing more.) An all-gather issued as asynchronous work
  (``unshard(async_op=True)``) is timed over the whole method, copy-out included.
- ``FSDPParamGroup.post_backward``, up to its call of ``foreach_reduce``: after a group's
  backward, the wait for the reduce-scatter before it (and for the previous reduction's end).
  ``foreach_reduce`` then copies the gradients in on the compute stream, which is compute. Not
  marked where gradients accumulate across backward passes (their sums run there too).
- ``FSDPState._root_post_backward_final_callback``: at the end of backward, the wait for the
  reduce-scatters (and HSDP's all-reduces) still running: the step's exposed tail. A group
  reduced in there (one whose inputs needed no gradient, often the root's) has its copy-in left
  out of the marks the same way.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any

from ..log import log
from .devicewaits import DeviceWaits
from .patching import MethodPatches

__all__ = ["FSDP2_MODULES", "Fsdp2", "FsdpWaitTiming", "fsdp2_classes"]

#: Where FSDP2's param group and state classes live: torch >= 2.6, then 2.4-2.5.
FSDP2_MODULES = (
    "torch.distributed.fsdp._fully_shard",
    "torch.distributed._composable.fsdp",
)

_UNSHARD = "wait_for_unshard"
_POST_BACKWARD = "post_backward"
_REDUCE = "foreach_reduce"
_TAIL = "_root_post_backward_final_callback"


@dataclass(frozen=True)
class Fsdp2:
    """The parts of FSDP2 the marks go around (tests pass stand-ins)."""

    #: ``FSDPParamGroup``.
    group: Any
    #: ``FSDPState``.
    state: Any
    #: The module ``post_backward`` looks ``foreach_reduce`` up in; None where it does not.
    reducing: Any = None


def fsdp2_classes() -> Fsdp2 | None:
    """Return this torch's FSDP2 parts, None where it has none by the names used here."""
    for package in FSDP2_MODULES:
        try:
            module = importlib.import_module(f"{package}._fsdp_param_group")
            group = module.FSDPParamGroup
            state = importlib.import_module(f"{package}._fsdp_state").FSDPState
        except (ImportError, AttributeError):
            continue
        if callable(getattr(group, _UNSHARD, None)) and callable(getattr(state, _TAIL, None)):
            reduces = callable(getattr(module, _REDUCE, None))
            reduces = reduces and callable(getattr(group, _POST_BACKWARD, None))
            return Fsdp2(group, state, module if reduces else None)
    return None


def _accumulating(group: Any) -> bool:
    """Whether a group holds gradients summed across backward passes (summed on the stream)."""
    params = getattr(group, "fsdp_params", ())
    return any(getattr(p, "unsharded_accumulated_grad", None) is not None for p in params)


class FsdpWaitTiming:
    """Put :class:`~exporter.sources.devicewaits.DeviceWaits` marks around FSDP2's waits.

    ``fsdp2``: FSDP2's parts (tests pass stand-ins); by default this torch's.
    ``instrument()``/``uninstrument()`` are idempotent, and restore only what still holds this
    instance's wrapper.
    """

    def __init__(self, device: DeviceWaits, fsdp2: Fsdp2 | None = None) -> None:
        self._device = device
        self._fsdp2 = fsdp2
        self._patched = MethodPatches()
        # Per thread (backward runs on autograd's): the mark ``foreach_reduce`` ends, and
        # whether the end-of-backward callback is running (its marks resume after a reduce).
        self._local = threading.local()

    def instrument(self) -> bool:
        """Wrap FSDP2's waits; return whether they are (False: no FSDP2 in this torch)."""
        if self._patched:
            return True
        fsdp2 = self._fsdp2 if self._fsdp2 is not None else fsdp2_classes()
        if fsdp2 is None:
            log.info("ddp-exporter: no FSDP2 in this torch: its waits are not timed on the device")
            return False
        wraps: list[tuple[Any, str, Any]] = [
            (fsdp2.group, _UNSHARD, self._wrap_unshard),
            (fsdp2.state, _TAIL, self._wrap_tail),
        ]
        if fsdp2.reducing is not None:
            wraps.append((fsdp2.group, _POST_BACKWARD, self._wrap_post_backward))
            wraps.append((fsdp2.reducing, _REDUCE, self._wrap_reduce))
        self._patched.apply(wraps)
        return True

    def uninstrument(self) -> None:
        """Restore every wrapped name unless someone replaced it since; idempotent."""
        self._patched.restore()

    def _wrap_unshard(self, original: Any) -> Any:
        device = self._device

        def wait_for_unshard(group: Any, *args: Any, **kwargs: Any) -> Any:
            result = getattr(group, "_all_gather_result", None)
            event = getattr(result, "all_gather_event", None)
            work = getattr(result, "all_gather_work", None)
            if event is None and work is None:
                return original(group, *args, **kwargs)  # nothing gathered (or one rank)
            start = device.begin()
            if start is None:
                return original(group, *args, **kwargs)
            if work is not None:
                # Asynchronous: the wait is the work's, inside (its event, recorded on the
                # current stream, completes with the compute before it, not with the gather).
                try:
                    return original(group, *args, **kwargs)
                finally:
                    device.end(start)
            device.wait(event)
            device.end(start)
            return original(group, *args, **kwargs)

        wait_for_unshard.__name__ = _UNSHARD
        return wait_for_unshard

    def _wrap_post_backward(self, original: Any) -> Any:
        device, local = self._device, self._local

        def post_backward(group: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(local, "tail", False) or not device.sampled() or _accumulating(group):
                return original(group, *args, **kwargs)  # the tail's marks cover it
            local.mark = device.begin()
            try:
                return original(group, *args, **kwargs)
            finally:
                mark, local.mark = local.mark, None
                if mark is not None:
                    device.drop(mark)  # nothing reduced: no wait to time

        post_backward.__name__ = _POST_BACKWARD
        return post_backward

    def _wrap_reduce(self, original: Any) -> Any:
        device, local = self._device, self._local

        def foreach_reduce(*args: Any, **kwargs: Any) -> Any:
            mark = getattr(local, "mark", None)
            if mark is None:
                return original(*args, **kwargs)
            local.mark = None
            device.end(mark)  # the waits before the copy-in
            try:
                return original(*args, **kwargs)
            finally:
                if getattr(local, "tail", False):
                    local.mark = device.begin()  # the tail's waits go on after it

        foreach_reduce.__name__ = _REDUCE
        return foreach_reduce

    def _wrap_tail(self, original: Any) -> Any:
        device, local = self._device, self._local

        def callback(state: Any, *args: Any, **kwargs: Any) -> Any:
            if not device.sampled():
                return original(state, *args, **kwargs)
            local.tail = True
            local.mark = device.begin()
            try:
                return original(state, *args, **kwargs)
            finally:
                local.tail = False
                mark, local.mark = local.mark, None
                if mark is not None:
                    device.end(mark)

        callback.__name__ = _TAIL
        return callback
