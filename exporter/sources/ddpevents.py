"""Time each DDP iteration's communication with three marks, DDP's built-in allreduce untouched.

A Python comm hook costs every gradient bucket tens of microseconds on the thread that runs the
backward: the GIL, a Python call, and a chain of futures whose tensors torch finds by pickling
their values. Where the GPU waits for the host (short steps, many buckets), that is the step's
own time. This mode adds nothing per bucket. In each iteration that synchronises gradients it
marks three points on the stream the backward computes on:

1. **first gradient**: the model's last parameter, whose gradient DDP receives first (it fills
   DDP's first bucket): where communication starts;
2. **compute end**: a final callback of the autograd engine, queued from that parameter's hook.
   The engine runs final callbacks in the order they were queued, and DDP queues its own
   (``finalize_backward``, which makes the stream wait for every bucket) only once its last
   bucket is ready, so this one runs first, with every backward kernel already issued;
3. **communication end**: a callback queued by the previous one, so after DDP's: the stream has
   waited for the last bucket.

Per iteration, first gradient to communication end is one observation of the collective latency
(DDP's first bucket launched to its last completed, as the ``reducer`` mode measures it), and
compute end to communication end is the communication the step waited for, moved from compute
to comm_wait. On CUDA the marks are CUDA events, created once and recorded on the stream the
first hook found current (no synchronisation; ``query()`` and ``elapsed_time()`` on a background
thread); elsewhere they are the host clock, since CPU kernels and gloo's waits run on the host.
Iterations inside ``no_sync()`` communicate nothing and are not marked; nor is one in which the
last parameter gets no gradient, or one recorded while the stream is captured into a CUDA graph.
The training thread pays three short Python calls per iteration, whatever the number of buckets.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Protocol

import torch

from ..background import BackgroundLoop
from ..errors import ErrorCounter
from .cudastreams import StreamLookup
from .recorder import CollectiveStats, Recorder

__all__ = [
    "RESOLVE_S",
    "SLOTS",
    "CudaMarks",
    "HostMarks",
    "IterationEvents",
    "Marks",
    "events_unsupported",
    "marks_for",
]

#: Iterations whose marks may wait to be resolved at once; beyond, an iteration goes unmarked
#: (counted untimed): the host would be this many iterations ahead of the GPU, or of the
#: resolving thread (over 1,000 iterations a second at its interval).
SLOTS = 256
#: How often the background thread resolves marks, seconds. Each wake takes the GIL from the
#: training thread for a moment: rarely enough that this stays far below 0.1 % of its time.
RESOLVE_S = 0.25


def events_unsupported(model: Any) -> str | None:
    """Return why ``model``'s iterations cannot be marked here, None when they can."""
    if not hasattr(model, "require_backward_grad_sync"):
        return "the model is not a DistributedDataParallel"
    if not callable(getattr(torch.Tensor, "register_post_accumulate_grad_hook", None)):
        return "this torch has no Tensor.register_post_accumulate_grad_hook"
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    if not callable(getattr(engine, "queue_callback", None)):
        return "this torch's autograd engine has no queue_callback"
    if not any(p.requires_grad for p in model.parameters()):
        return "the model has no parameter that requires a gradient"
    return None


class Marks(Protocol):
    """Record an iteration's three marks and turn them into seconds."""

    def slot(self) -> list[Any]:
        """Return storage for one iteration's three marks."""

    def begin(self, marks: list[Any]) -> bool:
        """Record the first mark; return False where none can be recorded now."""

    def mark(self, marks: list[Any], i: int) -> None:
        """Record mark ``i`` (1: compute end, 2: communication end)."""

    def done(self, marks: list[Any]) -> bool:
        """Say whether every mark has happened (without waiting)."""

    def seconds(self, marks: list[Any]) -> tuple[float, float]:
        """Return (first to last mark, compute end to last mark) in seconds."""


class HostMarks:
    """Marks on the host clock: where the backward and its collectives run on the host (CPU)."""

    def slot(self) -> list[Any]:
        """Return three timestamps."""
        return [0.0, 0.0, 0.0]

    def begin(self, marks: list[Any]) -> bool:
        """Record the first gradient's time."""
        marks[0] = time.perf_counter()
        return True

    def mark(self, marks: list[Any], i: int) -> None:
        """Record mark ``i``'s time."""
        marks[i] = time.perf_counter()

    def done(self, marks: list[Any]) -> bool:
        """Host marks happen as they are recorded."""
        return True

    def seconds(self, marks: list[Any]) -> tuple[float, float]:
        """Return the communication span and its exposed part."""
        return max(marks[2] - marks[0], 0.0), max(marks[2] - marks[1], 0.0)


class CudaMarks:
    """Marks as CUDA events recorded on the backward's stream, found once per iteration."""

    def __init__(self, device: torch.device) -> None:
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._streams = StreamLookup(self._index)
        self._stream: Any = None

    def slot(self) -> list[Any]:
        """Return three timing events (CUDA creates each at its first record)."""
        return [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def begin(self, marks: list[Any]) -> bool:
        """Record the first mark on the current stream, which the other two marks reuse."""
        if torch.cuda.is_current_stream_capturing():
            return False  # an event recorded into a CUDA graph would time the graph's replays
        self._stream = self._streams.current()
        marks[0].record(self._stream)
        return True

    def mark(self, marks: list[Any], i: int) -> None:
        """Record mark ``i`` on the iteration's stream."""
        marks[i].record(self._stream)

    def done(self, marks: list[Any]) -> bool:
        """Say whether the GPU passed the last mark (no synchronisation)."""
        # On the resolver thread, with this GPU current: a CUDA call on a thread whose device
        # was never set makes a context on GPU 0, hundreds of MiB there for every rank.
        with torch.cuda.device(self._index):
            return bool(marks[2].query())

    def seconds(self, marks: list[Any]) -> tuple[float, float]:
        """Return the GPU time from the first and from the second mark to the last."""
        with torch.cuda.device(self._index):
            span = marks[0].elapsed_time(marks[2]) / 1e3
            exposed = marks[1].elapsed_time(marks[2]) / 1e3
        return max(span, 0.0), max(exposed, 0.0)


def marks_for(device: torch.device) -> Marks:
    """Return the marks that time an iteration on ``device``: CUDA events, else the host clock."""
    return CudaMarks(device) if device.type == "cuda" else HostMarks()


class _Slot:
    """One iteration's marks; ``queued`` until the resolver has read them."""

    __slots__ = ("marks", "queued")

    def __init__(self, marks: list[Any]) -> None:
        self.marks = marks
        self.queued = False


class IterationEvents:
    """Mark each synchronising iteration of a DDP model; resolve the marks on a background thread.

    ``instrument()``/``uninstrument()`` add and remove the hook (idempotent); :meth:`close` also
    stops the thread, after resolving what the GPU has already passed.
    """

    name = "events"

    def __init__(
        self,
        model: Any,
        recorder: Recorder,
        errors: ErrorCounter,
        stats: CollectiveStats,
        marks: Marks | None = None,
        *,
        slots: int = SLOTS,
        interval_s: float = RESOLVE_S,
    ) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        self._model = model
        self._recorder = recorder
        self._errors = errors
        self._stats = stats
        #: The parameter whose gradient DDP receives first: the last one registered.
        self.marker: torch.Tensor = params[-1]
        self._marks = marks if marks is not None else marks_for(self.marker.device)
        #: Bytes of gradients DDP reduces each iteration (its buckets hold every one).
        self.nbytes = sum(p.numel() * p.element_size() for p in params)
        self._ring = [_Slot(self._marks.slot()) for _ in range(slots)]
        self._next = 0
        self._open: _Slot | None = None
        self._queue: deque[_Slot] = deque()
        self._engine = torch.autograd.Variable._execution_engine
        self._handle: Any = None
        #: Iterations left unmarked because the GPU was ``slots`` iterations behind (counted as
        #: untimed collectives).
        self.skipped = 0
        self._loop = BackgroundLoop(
            "ddp-exporter-events", self.drain, interval_s, errors=errors, where="comm_timing"
        )

    @property
    def pending(self) -> int:
        """Return how many marked iterations wait to be resolved."""
        return len(self._queue)

    def instrument(self) -> bool:
        """Hook the first gradient; return True (every synchronising iteration is marked)."""
        if self._handle is None:
            self._handle = self.marker.register_post_accumulate_grad_hook(self._first_grad)
            if not self._loop.started:
                self._loop.start()
        return True

    def uninstrument(self) -> None:
        """Remove the hook; idempotent. Marks already queued are still resolved."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._open = None

    def close(self) -> None:
        """Remove the hook, resolve what the GPU has passed, stop the thread."""
        self.uninstrument()
        self._loop.close()
        try:
            self.drain()
        except Exception as exc:  # noqa: BLE001
            self._errors.record("comm_timing", exc)

    # -- on the autograd engine's thread, once per synchronising iteration --------------------
    def _first_grad(self, param: torch.Tensor) -> None:
        try:
            if not self._model.require_backward_grad_sync:
                return  # no_sync(): DDP reduces nothing in this backward
            slot = self._ring[self._next]
            if slot.queued:  # its marks not resolved yet: the GPU is far behind
                self.skipped += 1
                self._recorder.iteration_untimed(self._stats, self.nbytes)
                return
            if self._marks.begin(slot.marks):
                self._open = slot
                self._engine.queue_callback(self._compute_done)
        except Exception as exc:  # noqa: BLE001 - never break the backward
            self._open = None
            self._errors.record("comm_timing", exc)

    def _compute_done(self) -> None:
        try:
            slot = self._open
            if slot is not None:
                self._marks.mark(slot.marks, 1)
                self._engine.queue_callback(self._comm_done)
        except Exception as exc:  # noqa: BLE001
            self._open = None
            self._errors.record("comm_timing", exc)

    def _comm_done(self) -> None:
        try:
            slot, self._open = self._open, None
            if slot is None:
                return
            self._marks.mark(slot.marks, 2)
            slot.queued = True
            self._queue.append(slot)
            self._next = (self._next + 1) % len(self._ring)
            # Without an optimizer or DataLoader, the end of DDP's backward closes the step.
            self._recorder.boundary("comm_hook")
        except Exception as exc:  # noqa: BLE001
            self._errors.record("comm_timing", exc)

    # -- on the background thread --------------------------------------------------------------
    def drain(self) -> None:
        """Resolve every queued iteration the GPU has passed, in order."""
        queue = self._queue
        while queue:
            slot = queue[0]
            if not self._marks.done(slot.marks):
                return
            queue.popleft()
            try:
                span, exposed = self._marks.seconds(slot.marks)
            finally:
                slot.queued = False
            self._recorder.iteration_timed(self._stats, span, exposed, self.nbytes)
