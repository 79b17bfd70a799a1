"""Time on the device how long a CUDA rank's compute stream waits for its collectives.

On a CUDA device a collective runs on a stream of its own. ``Work.wait()``, ``wait_tensor`` and
FSDP2's waits for its all-gathers and reduce-scatters only make the compute stream wait for it,
and return at once on the host. The time a healthy rank waits for a straggler is spent on the
device: its compute stream idles until the collective ends. Counted as compute, it makes every
rank look as slow as the straggler, and nobody is named.

Two CUDA events on the compute stream measure that wait: one recorded just before the stream is
made to wait, one just after. The second completes when the collective has ended and the work
queued before the wait is done, so the time between them is how long the stream waited (none
where the collective ended before the stream got there). :class:`DeviceWaits` records such
pairs where the parts that know the wait points ask it to (:mod:`exporter.sources.fsdpwaits`,
:mod:`exporter.sources.classicwaits`, the functional collectives' ``wait_tensor``,
``Work.wait()`` on the default stream, a synchronous collective on the default stream: NCCL
runs that one on the caller's stream, so the compute stream spends the collective's whole time
in it, its wait for its peers included), and resolves them off the training thread
(``Event.query()``: no synchronisation), moving their time from compute to comm_wait
(:meth:`~exporter.sources.recorder.Recorder.add_comm_wait`: never compute a scrape has read). A
wait inside one the same thread has marked already is not marked again: its time is in the
outer pair.

Sampled: only the waits of every ``every``-th step are timed (two events each, about ten
microseconds of host time), and each counts ``every`` times. Nothing is recorded while torch
compiles the caller, while a CUDA graph is being captured, or inside a declared section that
interrupts training.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..background import BackgroundLoop
from ..errors import ErrorCounter
from ..log import log
from .cudastreams import StreamLookup
from .recorder import Recorder
from .training import or_main_thread

__all__ = ["CudaEvents", "DeviceWaits", "EventSource", "MAX_PENDING"]

#: Pairs waiting to complete; beyond, new waits are not timed (a device far behind the host).
MAX_PENDING = 65536


class EventSource(Protocol):
    """Record marks on the current stream and measure between them (CUDA events; tests: a clock)."""

    def usable(self) -> bool:
        """Return whether a mark may be recorded now (not while a CUDA graph is captured)."""

    def on_default_stream(self) -> bool:
        """Return whether the current stream is the device's default stream."""

    def record(self) -> Any:
        """Record a mark on the current stream; return it."""

    def wait(self, event: Any) -> None:
        """Make the current stream wait for ``event`` (another stream's mark)."""

    def elapsed(self, start: Any, end: Any) -> float | None:
        """Return the seconds from ``start`` to ``end``, None while ``end`` has not completed."""


class CudaEvents:
    """Timing CUDA events on the current stream of the current device.

    ``index``: the rank's GPU; marks are made only while it is the current device (None: any).
    """

    def __init__(self, index: int | None = None) -> None:
        self.index = index
        self._told = False
        # The current stream without torch.cuda.current_stream()'s Stream object at each call:
        # a timed wait checks it once and records two events on it.
        self._streams = StreamLookup(index)

    def usable(self) -> bool:
        """Return False on another GPU than the rank's, or while a CUDA graph is captured."""
        # First: any other CUDA call on a thread whose device is not the rank's would make a
        # context on that GPU (GPU 0 for a thread whose device was never set), and its stream
        # is not the rank's compute stream.
        current = torch.cuda.current_device() if self.index is not None else None
        if current != self.index:
            if not self._told:
                self._told = True
                log.warning(
                    "ddp-exporter: a wait for a collective on cuda:%d was made with cuda:%d "
                    "current: such waits are not timed on the device (call "
                    "torch.cuda.set_device(%d) before training)",
                    self.index,
                    current,
                    self.index,
                )
            return False
        # A timing event recorded during capture would invalidate the user's graph.
        return not torch.cuda.is_current_stream_capturing()

    def on_default_stream(self) -> bool:
        """Return whether the current stream is the current device's default stream."""
        return self._streams.on_default()

    def record(self) -> torch.cuda.Event:
        """Record a timing event on the current stream."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(self._streams.current())
        return event

    def wait(self, event: Any) -> None:
        """Make the current stream wait for ``event``."""
        self._streams.current().wait_event(event)

    def elapsed(self, start: Any, end: Any) -> float | None:
        """Return the device time between the events once ``end`` has completed."""
        # Read off the training thread, with the events' GPU current: a CUDA call on a thread
        # whose device was never set makes a context on GPU 0, hundreds of MiB there for every
        # rank of the node.
        with torch.cuda.device(end.device):
            if not end.query():
                return None
            return float(start.elapsed_time(end)) / 1000.0


def _never() -> bool:
    return False


def _no_backward() -> int:
    return -1


#: Whether torch.compile is tracing the caller (then the graph, not this call, runs the wait).
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", _never)
#: The autograd graph task running on this thread, -1 outside a backward pass (private:
#: feature-detected; without it, only the training thread's waits are the compute's).
_graph_task_id = getattr(torch._C, "_current_graph_task_id", _no_backward)


class DeviceWaits:
    """Time the compute stream's waits for collectives every ``every`` steps; add them to comm_wait.

    ``begin()`` before the stream is made to wait and ``end(mark)`` after it, on whatever thread
    waits (the training thread, autograd's for a backward). A background thread resolves the
    pairs in order; :meth:`drain` may also be called at scrape time, so a scrape after the device
    is synchronised sees every wait. ``events``: where marks come from (default: CUDA events on
    GPU ``gpu``). ``training_thread``: the thread that trains (default: the main thread).
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        *,
        every: int,
        events: EventSource | None = None,
        gpu: int | None = None,
        interval_s: float = 0.05,
        training_thread: int | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self.events: EventSource = events if events is not None else CudaEvents(gpu)
        # The thread that trains, as for the host's timing of waits.
        self._thread = or_main_thread(training_thread)
        self._rec = recorder
        self._errors = errors
        self._pending: deque[tuple[Any, Any]] = deque()
        self._lock = threading.Lock()
        # Per thread: the mark of the wait under way, inside which no wait is marked again.
        self._open = threading.local()
        #: Waits resolved so far (each counted ``every`` times in comm_wait).
        self.resolved = 0
        self._loop = BackgroundLoop(
            "ddp-exporter-device-waits", self.drain, interval_s, errors=errors, where="comm_timing"
        ).start()

    def sampled(self) -> bool:
        """Return whether waits made now are timed (a few plain reads; never raises)."""
        if _is_compiling():  # first: torch.compile would guard on the step count
            return False
        rec = self._rec
        # The last step of each ``every`` (with more than one, never the first step, which sets
        # up communicators); not inside a section that interrupts training (not a step's time).
        return rec.steps % self.every == self.every - 1 and not rec.paused

    def begin(self, *, compute: bool = False) -> Any:
        """Return a mark recorded now if this step's waits are timed, else None; never raises.

        None too inside a wait this thread has marked already (its time is counted once). With
        ``compute`` (a ``Work.wait()``, which any thread may call on any stream), None unless
        the training thread or a backward pass waits, on the device's default stream: a stream
        of FSDP's own waiting for its collective, or a checkpoint thread waiting while the
        training thread queues compute on the same stream, is not the compute stream waiting.
        A mark returned is closed by :meth:`end` or given up by :meth:`drop`.
        """
        if not self.sampled() or getattr(self._open, "mark", None) is not None:
            return None
        try:
            if compute and threading.get_ident() != self._thread and _graph_task_id() < 0:
                return None
            events = self.events
            if not events.usable() or (compute and not events.on_default_stream()):
                return None
            mark = self._open.mark = events.record()
            return mark
        except Exception as exc:  # noqa: BLE001 - never in the way of the collective
            self._errors.record("comm_timing", exc)
            return None

    def marked(self, wait: Callable[..., Any]) -> Callable[..., Any]:
        """Return ``wait`` (a ``Work.wait()``) with marks around the compute stream's wait in it."""

        @functools.wraps(wait)
        def marked_wait(*args: Any, **kwargs: Any) -> Any:
            return self.marked_call(wait, *args, **kwargs)

        return marked_wait

    def marked_call(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``call`` with marks around the compute stream's time in it; return its result.

        For a ``Work.wait()``, and for a synchronous collective: NCCL runs one on the caller's
        stream and returns no Work to wait for, so the compute stream's time in it, waiting for
        its peers included, lies between marks around the call.
        """
        mark = self.begin(compute=True)
        try:
            return call(*args, **kwargs)
        finally:
            if mark is not None:
                self.end(mark)

    def drop(self, start: Any) -> None:
        """Give up the wait :meth:`begin` marked: nothing is timed."""
        if getattr(self._open, "mark", None) is start:
            self._open.mark = None

    def end(self, start: Any) -> None:
        """Close the wait :meth:`begin` marked (``start`` not None); never raises."""
        self.drop(start)
        if len(self._pending) >= MAX_PENDING:
            return  # the device is far behind: this wait is not timed
        try:
            self._pending.append((start, self.events.record()))
        except Exception as exc:  # noqa: BLE001
            self._errors.record("comm_timing", exc)

    def wait(self, event: Any) -> None:
        """Make the current stream wait for ``event`` (see :class:`EventSource`); never raises."""
        try:
            self.events.wait(event)
        except Exception as exc:  # noqa: BLE001 - the caller's own wait follows
            self._errors.record("comm_timing", exc)

    def drain(self) -> int:
        """Move the completed waits' time, in order, to comm_wait; return how many (never raises).

        A scrape waits for a drain under way on the thread, so that it reads every wait done.
        """
        with self._lock:
            total, done = 0.0, 0
            pending = self._pending
            while pending:
                start, end = pending[0]
                try:
                    seconds = self.events.elapsed(start, end)
                except Exception as exc:  # noqa: BLE001 - a pair that cannot be read is dropped
                    pending.popleft()
                    self._errors.record("comm_timing", exc)
                    continue
                if seconds is None:
                    break
                pending.popleft()
                total += max(seconds, 0.0)
                done += 1
            if total > 0.0:
                self._rec.add_comm_wait(total * self.every, self.every)
            self.resolved += done
            return done

    def close(self) -> None:
        """Stop the thread."""
        self._loop.close()
