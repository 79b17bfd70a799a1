"""Count a DDP step's waits for collectives of its own as communication, not compute.

DDP's gradient communication is timed by its reducer, the iteration marks or the comm hook
(:mod:`exporter.sources.commtiming`). A DDP training step often waits for collectives of its own
too: a loss or a metric all-reduced for logging, SyncBatchNorm's all-gathers in the forward
pass, a barrier. A straggler's peers wait for it there; counted as compute, that wait gives every
rank the straggler's compute and hides it. :class:`WaitTiming` wraps ``Work.wait``, which every
synchronous ``torch.distributed`` collective calls and an asynchronous one's caller calls, and
adds the training thread's time inside it to the step's comm_wait
(:meth:`~exporter.sources.recorder.Recorder.comm_blocked`).

It counts no collective: DDP's collective series stay DDP's buckets, and the in-flight state
comes from the Flight Recorder or the hook as before. DDP itself waits in C++, never through
this method, and its Python comm hooks consume futures. Where ``Work.wait`` cannot be replaced,
nothing is, and those waits stay compute. Cost: about 1 µs per wait on the training thread (two
clock reads and a lock, measured on a finished gloo all-reduce's wait), none elsewhere, none for
DDP's own communication.

On a GPU ``Work.wait()`` only makes the current stream wait: where a
:class:`~exporter.sources.devicewaits.DeviceWaits` is given, the default stream's wait is timed
on the device instead, on the training thread or in a backward pass (SyncBatchNorm's runs on
autograd's thread); see :meth:`~exporter.sources.devicewaits.DeviceWaits.begin`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ..errors import ErrorCounter
from .devicewaits import DeviceWaits
from .patching import patch_method, restore_method
from .recorder import Recorder
from .training import or_main_thread

__all__ = ["WaitTiming"]


class WaitTiming:
    """Add the training thread's time in ``Work.wait()`` to the step's comm_wait; undo it.

    ``training_thread``: the thread whose waits count (default: the main thread).
    ``work_class``: the class whose ``wait`` is wrapped (``torch.distributed.Work``).
    ``device``: on a GPU, what times the waits on the device instead.
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        *,
        training_thread: int | None = None,
        work_class: Any = None,
        device: DeviceWaits | None = None,
    ) -> None:
        self._device = device
        self._rec = recorder
        self._errors = errors
        self._thread = or_main_thread(training_thread)
        self._work = work_class if work_class is not None else getattr(dist, "Work", None)
        self._wait: tuple[Any, Any] | None = None

    @property
    def instrumented(self) -> bool:
        """Say whether ``Work.wait`` is wrapped."""
        return self._wait is not None

    def instrument(self) -> bool:
        """Wrap ``Work.wait`` (idempotent); return whether it is wrapped."""
        if self._wait is None:
            self._wait = patch_method(self._work, "wait", self._wrap)
        return self._wait is not None

    def uninstrument(self) -> None:
        """Restore ``Work.wait`` unless someone replaced it again since; idempotent."""
        restore_method(self._work, "wait", self._wait)
        self._wait = None

    def _wrap(self, wait: Callable[..., Any]) -> Callable[..., Any]:
        if self._device is not None:
            return self._device.marked(wait)
        rec, errors, training = self._rec, self._errors, self._thread

        @functools.wraps(wait)
        def timed_wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != training:
                return wait(work, *args, **kwargs)
            t0 = rec.clock()
            try:
                return wait(work, *args, **kwargs)
            finally:
                try:
                    rec.comm_blocked(rec.clock() - t0)
                except Exception as exc:  # noqa: BLE001 - never in the way of the wait
                    errors.record("comm_timing", exc)

        return timed_wait
