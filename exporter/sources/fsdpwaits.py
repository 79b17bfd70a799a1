"""Mark where FSDP2's compute stream waits for its all-gathers and its last reductions.

FSDP2 (``fully_shard``) issues its all-gathers and reduce-scatters on streams of its own; on a
CUDA device the compute stream is made to wait for them with events, never through
``Work.wait()``. Two of its methods hold the waits that expose communication (torch >= 2.4,
private, found by name in either of the modules FSDP2 has lived in):

- ``FSDPParamGroup.wait_for_unshard``: before a group's forward or backward, its parameters'
  all-gather. The part waits for the all-gather's event itself, between its two marks, before
  FSDP2 does: the copy-out that follows is compute, not a wait. (FSDP2's second wait for the
  same event orders nothing more.) An all-gather issued as asynchronous work
  (``unshard(async_op=True)``) is timed over the whole method, copy-out included.
- ``FSDPState._root_post_backward_final_callback``: at the end of backward, the wait for the
  reduce-scatters (and HSDP's all-reduces) still running: the step's exposed tail.

Not marked: each group's wait, in its backward, for the reduce-scatter before it, where FSDP2
also copies the gradients in on the compute stream (marks around the method would count that
copy). A healthy rank's wait in backward mostly shows at the next all-gather, queued behind that
reduce-scatter on the same communicator; with ``reshard_after_forward=False`` (no all-gather in
backward) it is counted as compute.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..log import log
from .devicewaits import DeviceWaits
from .patching import patch_method, restore_method

__all__ = ["FSDP2_MODULES", "FsdpWaitTiming", "fsdp2_classes"]

#: Where FSDP2's param group and state classes live: torch >= 2.6, then 2.4-2.5.
FSDP2_MODULES = (
    "torch.distributed.fsdp._fully_shard",
    "torch.distributed._composable.fsdp",
)

_UNSHARD = "wait_for_unshard"
_TAIL = "_root_post_backward_final_callback"


def fsdp2_classes() -> tuple[Any, Any] | None:
    """Return FSDP2's ``(FSDPParamGroup, FSDPState)`` classes, None where this torch has none."""
    for package in FSDP2_MODULES:
        try:
            group = importlib.import_module(f"{package}._fsdp_param_group").FSDPParamGroup
            state = importlib.import_module(f"{package}._fsdp_state").FSDPState
        except (ImportError, AttributeError):
            continue
        if callable(getattr(group, _UNSHARD, None)) and callable(getattr(state, _TAIL, None)):
            return group, state
    return None


class FsdpWaitTiming:
    """Put :class:`~exporter.sources.devicewaits.DeviceWaits` marks around FSDP2's waits.

    ``classes``: FSDP2's ``(FSDPParamGroup, FSDPState)`` (tests pass stand-ins); by default
    this torch's. ``instrument()``/``uninstrument()`` are idempotent, and restore only what still
    holds this instance's wrapper.
    """

    def __init__(self, device: DeviceWaits, classes: tuple[Any, Any] | None = None) -> None:
        self._device = device
        self._classes = classes
        self._patched: list[tuple[Any, str, tuple[Any, Any] | None]] = []

    def instrument(self) -> bool:
        """Wrap the two methods; return whether they are (False: no FSDP2 in this torch)."""
        if self._patched:
            return True
        classes = self._classes if self._classes is not None else fsdp2_classes()
        if classes is None:
            log.info("ddp-exporter: no FSDP2 in this torch: its waits are not timed on the device")
            return False
        group, state = classes
        for owner, name, wrap in (
            (group, _UNSHARD, self._wrap_unshard),
            (state, _TAIL, self._wrap_tail),
        ):
            self._patched.append((owner, name, patch_method(owner, name, wrap)))
        return True

    def uninstrument(self) -> None:
        """Restore both methods unless someone replaced them since; idempotent."""
        for owner, name, patched in reversed(self._patched):
            restore_method(owner, name, patched)
        self._patched.clear()

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

    def _wrap_tail(self, original: Any) -> Any:
        device = self._device

        def callback(state: Any, *args: Any, **kwargs: Any) -> Any:
            start = device.begin()
            if start is None:
                return original(state, *args, **kwargs)
            try:
                return original(state, *args, **kwargs)
            finally:
                device.end(start)

        callback.__name__ = _TAIL
        return callback
