"""Choose and start what times a rank's communication, for each kind of parallelism.

DDP: its reducer's own timers or the timing comm hook (:mod:`exporter.sources.reducer`,
:mod:`exporter.sources.commhook`), as ``comm_timing`` asks. Anything else (FSDP2, FSDP, a loop
of collectives): the ``torch.distributed`` wrappers (:mod:`exporter.sources.collectives`). With
either, the functional collectives DTensor issues (tensor parallelism, ``clip_grad_norm_`` on
DTensor parameters): :mod:`exporter.sources.functional`. The result is what the observer keeps:
the parts to uninstrument at close, the mode published in ``ddp_rank_info{comm_timing}``, the
hook and the CUDA resolver where there are any.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ErrorCounter
from .collectives import CollectiveTiming
from .commhook import CommHookInstrumentor, CommHookWrapper, CudaEventResolver, allreduce_mean_hook
from .flight import pg_timeout_seconds
from .functional import FunctionalCollectiveTiming
from .recorder import Recorder
from .reducer import ReducerTiming, choose_timing

__all__ = ["CommTiming", "Part", "Parts", "start_comm_timing"]


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
    #: ``reducer``, ``hook``, ``collectives`` or ``none`` (``ddp_rank_info{comm_timing}``).
    mode: str
    #: The timing comm hook; None unless DDP's communication is timed by the hook.
    hook: CommHookWrapper | None = None
    #: Resolves the hook's CUDA events off the training thread; None elsewhere.
    cuda: CudaEventResolver | None = None


def start_comm_timing(
    model: Any,
    parallelism: str,
    recorder: Recorder,
    errors: ErrorCounter,
    *,
    requested: str,
    inflight: str,
    cuda: bool,
) -> CommTiming:
    """Start timing ``model``'s communication; ``requested`` is the ``comm_timing`` setting.

    ``inflight`` names the in-flight source (the reducer mode needs the Flight Recorder).
    """
    # DTensor's collectives (tensor parallelism, clip_grad_norm_ on DTensor parameters), timed
    # where the rank waits for them, whatever the parallelism.
    functional = FunctionalCollectiveTiming(recorder, errors, timed=not cuda)
    functional.instrument()
    if parallelism != "ddp":
        # FSDP2, FSDP, a plain loop: every torch.distributed collective, timed where called.
        wrappers = CollectiveTiming(recorder, errors, timed=not cuda)
        mode = "collectives" if wrappers.instrument() else "none"
        recorder.time_comm_by_waits()
        return CommTiming(Parts(wrappers, functional), mode)
    pg = model.process_group
    stats = recorder.collective_stats("allreduce", getattr(pg, "group_name", "0") or "0",
                                      pg_timeout_seconds(pg))  # fmt: skip
    mode = choose_timing(requested, model, inflight, recorder.mode)
    hooked = mode == "hook"
    resolver = CudaEventResolver(recorder, errors) if cuda and hooked else None
    hook = CommHookWrapper(recorder, errors, stats, allreduce_mean_hook, pg,
                           resolver) if hooked else None  # fmt: skip
    # hook is None exactly when not hooked; the tests below tell the type checker which part.
    part = CommHookInstrumentor(model, hook) if hook is not None else ReducerTiming(model, errors)
    if not part.instrument():
        mode = "none"  # a hook registered before the wrapper: not timed
    elif isinstance(part, ReducerTiming):  # not hooked
        recorder.time_comm_with(part.read, stats)
    return CommTiming(Parts(part, functional), mode, hook, resolver)
