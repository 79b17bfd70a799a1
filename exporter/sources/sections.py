"""Time named sections (checkpoint, evaluation, data preparation) against a deadline.

``with exporter.deadline("checkpoint", seconds=600):`` or ``@exporter.deadline(...)`` replaces the
hand-made ``threading.Timer`` watchdog: the section's start time, deadline, last duration and
run count are published per ``section`` label, and the generated alert DDPSectionOverdue fires
*while* a section is still running past its deadline.

Sections live in a process-wide registry (:data:`REGISTRY`), so they work with or without
:func:`exporter.instrument`: the collector reads the registry at scrape time, and sections
entered before ``instrument()`` show up once the endpoint serves.

``section`` is a label, so its values must stay a small fixed set: a name must be a short
identifier and a process accepts at most :data:`MAX_SECTIONS` distinct names; anything else is
rejected with a ``ValueError`` when the deadline is created.

Nested or concurrent runs of one name (a decorated function called from two threads, or
recursively) are each timed on their own. While any run, the published start time and deadline
are those of the run that is due first (start + deadline smallest), so the alert fires as soon
as any of them is overdue; ``ddp_section_runs_total`` and the last duration count every run.

A rank inside a section within its deadline is not hung, nor are the ranks waiting for it in a
collective (:mod:`exporter.hangs.definition`, the generated rules and ``top`` all honour it):
:meth:`SectionRegistry.busy` tells. Listeners (the instrumented rank's recorder) hear of every
run that starts or ends, with the thread it runs on.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from ..errors import ErrorCounter
from ..log import log

if TYPE_CHECKING:  # read by the type checker only (typing.TypeIs is Python 3.13+)
    from typing_extensions import TypeIs

__all__ = [
    "MAX_SECTIONS",
    "REGISTRY",
    "Deadline",
    "NamedSectionListener",
    "SectionListener",
    "SectionRegistry",
    "SectionState",
    "deadline",
]

#: Most distinct section names one process accepts (the ``section`` label stays bounded).
MAX_SECTIONS = 16

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


@dataclass(frozen=True)
class SectionState:
    """What the collector publishes for one section name."""

    name: str
    deadline_s: float
    runs: int
    last_duration_s: float | None
    #: Unix start time of the running instance due first; None when none runs.
    started_unix: float | None
    #: Unix end time of the last run that ended within its deadline; None before one has.
    ended_unix: float | None = None


@dataclass
class _Run:
    start_unix: float
    start_mono: float
    deadline_s: float


class SectionListener(Protocol):
    """What a listener of the section registry implements (both are called on the section's
    thread, outside the registry's lock, and must not raise).

    A listener with a true ``wants_names`` attribute is called with the section's name:
    ``section_begin(name)``, ``section_end(name)`` (:class:`NamedSectionListener`).
    """

    def section_begin(self) -> None:
        """A run of a section starts on the calling thread."""

    def section_end(self) -> None:
        """A run of a section ends on the calling thread."""


class NamedSectionListener(Protocol):
    """A listener that keeps time by section (the goodput account): told each run's name."""

    @property
    def wants_names(self) -> bool:
        """True: call ``section_begin(name)`` and ``section_end(name)``."""

    def section_begin(self, name: str) -> None:
        """A run of the section ``name`` starts on the calling thread."""

    def section_end(self, name: str) -> None:
        """A run of the section ``name`` ends on the calling thread."""


def _wants_names(
    listener: SectionListener | NamedSectionListener,
) -> TypeIs[NamedSectionListener]:
    return bool(getattr(listener, "wants_names", False))


class _Section:
    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.runs = 0
        self.last_duration_s: float | None = None
        self.last_end_unix: float | None = None
        self.active: dict[int, _Run] = {}


def _check(name: object, seconds: object) -> float:
    """Return ``seconds`` as a float after validating both arguments; raise ValueError/TypeError."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"exporter.deadline({name!r}): a section name must be a short identifier "
            "(letters, digits, underscore; at most 32 characters, not starting with a digit), "
            "because it becomes the value of the bounded label `section`"
        )
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(
            f"exporter.deadline({name!r}, seconds=...): expected a number, got {seconds!r}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"exporter.deadline({name!r}, seconds=...): expected a positive finite number of "
            f"seconds, got {seconds!r}"
        )
    return float(seconds)


class SectionRegistry:
    """Hold every section name of the process with its runs; read by the collector at scrape."""

    def __init__(self, max_sections: int = MAX_SECTIONS) -> None:
        self.max_sections = max_sections
        self.errors = ErrorCounter()
        self._lock = threading.Lock()
        self._sections: dict[str, _Section] = {}
        self._tokens = itertools.count()
        self._listeners: tuple[SectionListener | NamedSectionListener, ...] = ()
        self._last_end: tuple[str, float] | None = None  # (name, monotonic time) of the last end

    def listen(self, listener: SectionListener | NamedSectionListener) -> None:
        """Tell ``listener`` of every run that starts or ends from now on."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def unlisten(self, listener: SectionListener | NamedSectionListener) -> None:
        """Stop telling ``listener``; a listener not listening is ignored."""
        with self._lock:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

    def _tell(self, begin: bool, name: str) -> None:
        for listener in self._listeners:
            try:
                # A listener that keeps time by section (the goodput account) is told the name.
                if _wants_names(listener):
                    listener.section_begin(name) if begin else listener.section_end(name)
                else:
                    listener.section_begin() if begin else listener.section_end()
            except Exception as exc:  # noqa: BLE001 - never break the user's section
                self.errors.record("section", exc)

    def busy(self, now_mono: float | None = None, grace_s: float = 0.0) -> str | None:
        """Return the name of a section running within its deadline on any thread, else None.

        ``grace_s``: a section that ended less than this long ago still counts (the ranks it
        held up need a moment to finish the collective they waited in).
        """
        now = time.monotonic() if now_mono is None else now_mono
        with self._lock:
            for name, section in self._sections.items():
                for run in section.active.values():
                    if now - run.start_mono <= run.deadline_s:
                        return name
            last = self._last_end
        if last is not None and now - last[1] <= grace_s:
            return last[0]
        return None

    def declare(self, name: str, seconds: float) -> None:
        """Register ``name`` with its deadline (the latest declaration wins); raise when full."""
        seconds = _check(name, seconds)
        with self._lock:
            section = self._sections.get(name)
            if section is None:
                if len(self._sections) >= self.max_sections:
                    known = ", ".join(sorted(self._sections))
                    raise ValueError(
                        f"exporter.deadline({name!r}): at most {self.max_sections} distinct "
                        f"section names per process (already: {known}); reuse a fixed name "
                        "instead of one per step, file or epoch"
                    )
                self._sections[name] = _Section(seconds)
            else:
                section.deadline_s = seconds

    def enter(self, name: str, seconds: float) -> int | None:
        """Start one run of ``name``; return its token (None if the exporter failed)."""
        try:
            now_unix, now_mono = time.time(), time.monotonic()
            with self._lock:
                section = self._sections.get(name)
                if section is None:  # declared, then cleared: declare again within the cap
                    if len(self._sections) >= self.max_sections:
                        raise ValueError(f"section {name!r} beyond {self.max_sections} names")
                    section = self._sections[name] = _Section(seconds)
                section.deadline_s = seconds
                token = next(self._tokens)
                section.active[token] = _Run(now_unix, now_mono, seconds)
            self._tell(True, name)
            return token
        except Exception as exc:  # noqa: BLE001 - never break the user's section
            self.errors.record("section", exc)
            return None

    def exit(self, name: str, token: int | None) -> None:
        """Finish the run ``token`` of ``name``: count it and keep its duration."""
        if token is None:
            return
        try:
            now = time.monotonic()
            with self._lock:
                section = self._sections.get(name)
                run = section.active.pop(token, None) if section is not None else None
                if section is not None and run is not None:  # a run has its section
                    duration = now - run.start_mono
                    section.runs += 1
                    section.last_duration_s = duration
                    if duration <= run.deadline_s:  # an overdue end excuses nothing after it
                        self._last_end = (name, now)
                        section.last_end_unix = run.start_unix + duration
            self._tell(False, name)  # also for a run forgotten by clear(): its begin was told
            if run is None:
                return  # cleared while running: forgotten, not an error
            if duration > run.deadline_s:
                log.warning(
                    "ddp-exporter: section %r took %.1f s, over its %g s deadline",
                    name,
                    duration,
                    run.deadline_s,
                )
        except Exception as exc:  # noqa: BLE001
            self.errors.record("section", exc)

    def snapshot(self) -> list[SectionState]:
        """Return the state of every section, in declaration order."""
        with self._lock:
            out = []
            for name, s in self._sections.items():
                deadline_s, started = s.deadline_s, None
                if s.active:
                    first = min(s.active.values(), key=lambda r: r.start_mono + r.deadline_s)
                    deadline_s, started = first.deadline_s, first.start_unix
                out.append(
                    SectionState(
                        name, deadline_s, s.runs, s.last_duration_s, started, s.last_end_unix
                    )
                )
            return out

    def clear(self) -> None:
        """Forget every section (tests, notebooks); runs still open finish silently."""
        with self._lock:
            self._sections.clear()


#: The process-wide registry that :func:`deadline` uses and the collector publishes.
REGISTRY = SectionRegistry()


class Deadline(contextlib.ContextDecorator):
    """A named section with a deadline; use it as a ``with`` block or as a decorator.

    Each ``with`` (or each call of a decorated function) is one run; runs may nest or overlap
    across threads, each timed on its own. Exceptions inside the section propagate unchanged.
    """

    def __init__(self, name: str, seconds: float, registry: SectionRegistry) -> None:
        self.name = name
        self.seconds = _check(name, seconds)
        self._registry = registry
        registry.declare(name, self.seconds)
        self._local = threading.local()

    def _stack(self) -> list[int | None]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def __enter__(self) -> Deadline:
        self._stack().append(self._registry.enter(self.name, self.seconds))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack = self._stack()
        self._registry.exit(self.name, stack.pop() if stack else None)


def deadline(name: str, *, seconds: float, registry: SectionRegistry | None = None) -> Deadline:
    """Time the section ``name`` against a deadline of ``seconds``.

    ``with exporter.deadline("checkpoint", seconds=600): save()`` or as a decorator,
    ``@exporter.deadline("eval", seconds=1800)``. Publishes ``ddp_section_*`` series labelled
    ``section=name``; DDPSectionOverdue fires while a run is still going past its deadline.
    Raises ValueError for a name that is not a short identifier, a non-positive deadline, or
    a name beyond the :data:`MAX_SECTIONS` distinct names of this process.
    """
    return Deadline(name, seconds, REGISTRY if registry is None else registry)
