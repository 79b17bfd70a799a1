"""Choose and start what times a rank's communication, for each kind of parallelism.

DDP: its reducer's own timers, marks of each iteration, or the timing comm hook
(:mod:`exporter.sources.reducer`, :mod:`exporter.sources.ddpevents`,
:mod:`exporter.sources.commhook`), as ``comm_timing`` asks. Anything else (FSDP2, FSDP, a loop
of collectives): the ``torch.distributed`` wrappers (:mod:`exporter.sources.collectives`). With
either, the functional collectives DTensor issues (tensor parallelism, ``clip_grad_norm_`` on
DTensor parameters): :mod:`exporter.sources.functional`. Beside DDP on a CPU, the training
thread's waits for collectives of its own: :mod:`exporter.sources.waits`. On a CUDA device, the
compute stream's waits for collectives outside DDP's own (FSDP2's, classic FSDP's, the
functional collectives', ``Work.wait()`` and synchronous collectives on the default stream),
timed on the device: :mod:`exporter.sources.devicewaits`, :mod:`exporter.sources.fsdpwaits`,
:mod:`exporter.sources.classicwaits`, and beside DDP :mod:`exporter.sources.syncmarks`. The
result is what the observer keeps: the parts to uninstrument at close, the mode published in
``ddp_rank_info{comm_timing}``, the hook and the background threads where there are any.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .. import settings
from ..errors import ErrorCounter
from ..log import log
from .classicwaits import ClassicFsdpWaitTiming
from .collectives import CollectiveTiming
from .commhook import CommHookInstrumentor, CommHookWrapper, CudaEventResolver, allreduce_mean_hook
from .ddpevents import IterationEvents, events_unsupported
from .devicewaits import DeviceWaits
from .durations import RecorderDurations
from .flight import pg_timeout_seconds
from .fsdpwaits import FsdpWaitTiming
from .functional import FunctionalCollectiveTiming
from .recorder import Recorder
from .reducer import ReducerTiming, unsupported
from .syncmarks import SyncCollectiveMarks
from .waits import WaitTiming

__all__ = ["CommTiming", "Part", "Parts", "choose_timing", "start_comm_timing"]


class Part(Protocol):
    """One timing part: puts its wrappers in place and takes them away again (idempotent)."""

    def instrument(self) -> bool:
        """Put the part in place; return whether it times anything."""

    def uninstrument(self) -> None:
        """Restore what the part replaced."""


class Parts:
    """Instrument and uninstrument several timing parts together, in order (idempotent)."""

    def __init__(self, *parts: Part) -> None:
        self.parts = parts

    def instrument(self) -> bool:
        """Put every part in place; return whether the first (the one that names the mode) is."""
        done = [part.instrument() for part in self.parts]
        return done[0]

    def uninstrument(self) -> None:
        """Restore what every part replaced, last first."""
        for part in reversed(self.parts):
            part.uninstrument()


@dataclass
class CommTiming:
    """What times communication on one rank, started."""

    #: Has ``instrument()``/``uninstrument()`` (idempotent): the reducer timing, the comm-hook
    #: instrumentor or the collective wrappers, with the functional collectives' timing
    #: (:class:`Parts`; the overhead benchmark toggles them).
    instrumentor: Any
    #: ``reducer``, ``events``, ``hook``, ``collectives`` or ``none``
    #: (``ddp_rank_info{comm_timing}``).
    mode: str
    #: The timing comm hook; None unless DDP's communication is timed by the hook.
    hook: CommHookWrapper | None = None
    #: What resolves DDP's timings off the training thread (the iteration marks, the hook's CUDA
    #: events), closed with the observer; None where nothing does.
    resolver: IterationEvents | CudaEventResolver | None = None
    #: The device waits (CUDA), closed with the observer; None where they are not timed.
    device: DeviceWaits | None = None
    #: Observes, at scrape time, the device times the Flight Recorder holds of the collectives
    #: the wrappers count untimed (CUDA without DDP); None elsewhere.
    durations: RecorderDurations | None = None

    def settlers(self) -> list[Callable[[], Any]]:
        """Return what brings the recorder up to date with the device before a scrape reads it."""
        found: list[Callable[[], Any]] = []
        if self.durations is not None:
            found.append(self.durations.drain)
        if self.device is not None:
            found.append(self.device.drain)
        return found

    def threads(self) -> list[IterationEvents | CudaEventResolver | DeviceWaits]:
        """Return the background threads to close with the observer."""
        return [t for t in (self.resolver, self.device) if t is not None]


def choose_timing(
    requested: str, model: Any, inflight: str, step_mode: str, *, keyword: bool = True
) -> str:
    """Return ``reducer``, ``events`` or ``hook`` for a ``comm_timing`` setting.

    ``auto`` leaves DDP's built-in allreduce alone wherever blame stays the same, which needs the
    in-flight state from the Flight Recorder (``inflight``; else only the hook's bookkeeping has
    it): DDP's reducer timers on CPU with steps closed by the optimizer or the DataLoader
    (``step_mode``: each step reads its own iteration as it closes), else the iteration marks
    (CUDA, where the reducer's timers would synchronise the host). ``reducer`` or ``events``
    asked for but impossible raises ValueError when given as a keyword (``keyword``); from
    ``DDP_EXPORTER_COMM_TIMING`` it is logged and ``auto`` chooses instead.
    """
    if requested == "hook":
        return "hook"
    if requested in ("reducer", "events"):
        why = unsupported(model) if requested == "reducer" else events_unsupported(model)
        if why and keyword:
            raise ValueError(f"exporter.instrument(comm_timing={requested!r}): {why}")
        if why:
            settings.report_unusable(
                settings.COMM_TIMING,
                accepted=f"a mode this model can use ({requested!r}: {why})",
                instead="choosing as 'auto' does",
            )
            return choose_timing("auto", model, inflight, step_mode)
        if inflight != "flight_recorder":
            log.warning(
                "ddp-exporter: comm_timing=%r without a usable Flight Recorder: no in-flight "
                "state, so hangs are neither alerted nor dumped",
                requested,
            )
        return requested
    if inflight != "flight_recorder":
        return "hook"
    if unsupported(model) is None and step_mode in ("optimizer", "dataloader"):
        return "reducer"
    return "events" if events_unsupported(model) is None else "hook"


def start_comm_timing(
    model: Any,
    parallelism: str,
    recorder: Recorder,
    errors: ErrorCounter,
    *,
    requested: str,
    inflight: str,
    cuda: bool,
    keyword: bool = True,
    device_every: int = 0,
    gpu: int | None = None,
    training_thread: int | None = None,
) -> CommTiming:
    """Start timing ``model``'s communication; ``requested`` is the ``comm_timing`` setting.

    ``inflight`` names the in-flight source (the reducer mode needs the Flight Recorder);
    ``keyword``: ``requested`` was given in code (see :func:`choose_timing`);
    ``device_every``: on a CUDA device, time the compute stream's waits for collectives outside
    DDP's own every this many steps (0: never); ``gpu``: the rank's CUDA device index;
    ``training_thread``: the thread whose waits are comm_wait (default: the main thread).
    """
    if parallelism != "ddp":
        device = _device_waits(
            recorder, errors, cuda=cuda, every=device_every, gpu=gpu, thread=training_thread
        )
        return _start_without_ddp(
            recorder, errors, cuda=cuda, device=device, thread=training_thread
        )
    # Chosen first: a mode asked for in code but impossible raises before anything is started.
    mode = choose_timing(requested, model, inflight, recorder.mode, keyword=keyword)
    device = _device_waits(
        recorder, errors, cuda=cuda, every=device_every, gpu=gpu, thread=training_thread
    )
    # DTensor's collectives (tensor parallelism, clip_grad_norm_ on DTensor parameters), timed
    # where the rank waits for them, whatever the parallelism.
    functional = FunctionalCollectiveTiming(
        recorder, errors, training_thread=training_thread, timed=not cuda, device=device
    )
    functional.instrument()
    # The step's own collectives (a logged loss, SyncBatchNorm): their waits are comm_wait.
    beside: tuple[Part, ...] = (functional,)
    if not cuda or device is not None:
        waits = WaitTiming(recorder, errors, training_thread=training_thread, device=device)
        waits.instrument()
        beside = (functional, waits)
    if device is not None:  # NCCL's synchronous collectives have no Work.wait() to mark
        sync = SyncCollectiveMarks(device)
        sync.instrument()
        beside = (*beside, sync)
    pg = model.process_group
    stats = recorder.collective_stats(
        "allreduce", getattr(pg, "group_name", "0") or "0", pg_timeout_seconds(pg)
    )
    if mode == "events":
        marks = IterationEvents(model, recorder, errors, stats)
        marks.instrument()
        return CommTiming(Parts(marks, *beside), mode, resolver=marks, device=device)
    hooked = mode == "hook"
    resolver = CudaEventResolver(recorder, errors) if cuda and hooked else None
    hook = (
        CommHookWrapper(recorder, errors, stats, allreduce_mean_hook, pg, resolver)
        if hooked
        else None
    )
    # hook is None exactly when not hooked; the tests below tell the type checker which part.
    part = CommHookInstrumentor(model, hook) if hook is not None else ReducerTiming(model, errors)
    if not part.instrument():
        mode = "none"  # a hook registered before the wrapper: not timed
    elif isinstance(part, ReducerTiming):  # not hooked
        recorder.time_comm_with(part.read, stats)
    return CommTiming(Parts(part, *beside), mode, hook, resolver, device=device)


def _device_waits(
    recorder: Recorder,
    errors: ErrorCounter,
    *,
    cuda: bool,
    every: int,
    gpu: int | None,
    thread: int | None,
) -> DeviceWaits | None:
    """Return what times the compute stream's waits on a GPU (where it waits, not the host)."""
    if not (cuda and every):
        return None
    return DeviceWaits(recorder, errors, every=every, gpu=gpu, training_thread=thread)


def _start_without_ddp(
    recorder: Recorder,
    errors: ErrorCounter,
    *,
    cuda: bool,
    device: DeviceWaits | None,
    thread: int | None,
) -> CommTiming:
    """Time FSDP2, FSDP or a plain loop: every collective where the rank waits for it."""
    functional = FunctionalCollectiveTiming(
        recorder, errors, training_thread=thread, timed=not cuda, device=device
    )
    functional.instrument()
    wrappers = CollectiveTiming(
        recorder, errors, training_thread=thread, timed=not cuda, device=device
    )
    mode = "collectives" if wrappers.instrument() else "none"
    recorder.time_comm_by_waits()
    parts: list[Part] = [wrappers, functional]
    if device is not None:
        for fsdp in (FsdpWaitTiming(device), ClassicFsdpWaitTiming(device)):
            fsdp.instrument()
            parts.append(fsdp)
    # On a GPU the host sees no collective end: NCCL's own timing, where it is on, does.
    durations = RecorderDurations(recorder, errors) if cuda else None
    return CommTiming(Parts(*parts), mode, device=device, durations=durations)
