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
stay its buckets. An asynchronous call is left to its ``Work.wait()``; a wait inside a
synchronous call, where a backend returns a Work, is part of the call's marks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ..errors import ErrorCounter
from .collectives import CollectiveSpec, specs
from .devicewaits import DeviceWaits
from .patching import Patcher
from .recorder import Recorder

__all__ = ["SyncCollectiveMarks"]


class SyncCollectiveMarks(Patcher):
    """Mark the compute stream around each synchronous ``torch.distributed`` collective; undo it.

    ``device``: what records and resolves the marks. ``namespace``: where the collectives live.
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        device: DeviceWaits,
        *,
        namespace: Any = dist,
    ) -> None:
        super().__init__(recorder, errors, training_thread=None, timed=False, namespace=namespace)
        self._device = device

    def instrument(self) -> bool:
        """Put the wrappers in place (idempotent); return whether any collective is wrapped."""
        if not self._patched:
            for name, (fn, spec) in specs(self._ns).items():
                self._replace(name, fn, self._wrap(fn, spec))
        return bool(self._patched)

    def uninstrument(self) -> None:
        """Restore every replaced name that still holds this instance's wrapper; idempotent."""
        self._restore()

    def _wrap(self, fn: Callable[..., Any], spec: CollectiveSpec) -> Callable[..., Any]:
        device = self._device

        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if spec.synchronous(args, kwargs):
                return device.marked_call(fn, *args, **kwargs)
            return fn(*args, **kwargs)

        return collective
