"""On a GPU, time a DDP step's synchronous collectives of its own on the device.

A DDP step often makes collectives of its own beside DDP's buckets: a loss or a metric
all-reduced for logging, a barrier. NCCL runs a synchronous one (``async_op=False``) on the
caller's stream and returns no Work, so no ``Work.wait()`` is called that
:class:`~exporter.sources.waits.WaitTiming` could mark: the compute stream itself runs the
collective, waiting in it for a straggler. Counted as compute, that wait gives every rank the
straggler's compute, and nobody is named.

:class:`SyncCollectiveMarks` wraps the ``torch.distributed`` collectives (the names every caller
looks up, as :class:`~exporter.sources.collectives.CollectiveTiming` does for a job without DDP)
and, for a synchronous call, has the
:class:`~exporter.sources.devicewaits.DeviceWaits` mark the compute stream before and after it
(:meth:`~exporter.sources.devicewaits.DeviceWaits.marked_call`: on the training thread or in a
backward pass, on the default stream, in sampled steps). It counts no collective: DDP's series
stay its buckets. An asynchronous call is left to its ``Work.wait()``, and so is a call that a
coalescing manager only queues; a wait inside a synchronous call, where a backend returns a
Work, is part of the call's marks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from .collectives import CollectiveSpec, specs
from .devicewaits import DeviceWaits
from .patching import MethodPatches

__all__ = ["SyncCollectiveMarks"]


class SyncCollectiveMarks:
    """Mark the compute stream around each synchronous ``torch.distributed`` collective; undo it.

    ``device``: what records and resolves the marks. ``namespace``: where the collectives live.
    """

    def __init__(self, device: DeviceWaits, *, namespace: Any = dist) -> None:
        self._device = device
        self._ns = namespace
        self._patched = MethodPatches()

    def instrument(self) -> bool:
        """Put the wrappers in place (idempotent); return whether any collective is wrapped."""
        if not self._patched:
            self._patched.apply(
                [
                    (self._ns, name, self._wrapper(spec))
                    for name, (_fn, spec) in specs(self._ns).items()
                ]
            )
        return bool(self._patched)

    def uninstrument(self) -> None:
        """Restore every replaced name that still holds this instance's wrapper; idempotent."""
        self._patched.restore()

    def _wrapper(self, spec: CollectiveSpec) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        device = self._device

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def collective(*args: Any, **kwargs: Any) -> Any:
                # In a coalescing manager the call only queues its op: the manager's wait for
                # the coalesced collective, at its exit, is the compute stream's.
                if spec.synchronous(args, kwargs) and not spec.queued(args, kwargs):
                    return device.marked_call(fn, *args, **kwargs)
                return fn(*args, **kwargs)

            return collective

        return wrap
