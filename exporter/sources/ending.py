"""Tell a clean end of training from a crash, and keep the time of a clean one.

A job has edges, and its end is one: a rank that ends cleanly publishes
``ddp_finished_timestamp_seconds`` in its final scrapes, so that the rules tell a finished job
from a killed one. What counts as clean:

- :func:`exporter.Observer.close` called while no exception is propagating (``try: train()
  finally: obs.close()`` after a normal return, a framework's end-of-training callback), or
  while ``sys.exit(0)`` is;
- the interpreter's exit (the exporter's ``atexit`` handler) when no uncaught exception ended
  the program, nor the training thread where that is not the main thread (:class:`ThreadCrash`).

Not clean: ``close()`` from a ``finally`` or ``except`` block while an error propagates, an
uncaught exception, and any death without Python's exit (SIGKILL, SIGTERM's default action, a
segfault, torchrun stopping the survivors of a failed attempt), which never reaches the exporter.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

__all__ = ["End", "ThreadCrash", "ending_cleanly", "exiting_cleanly"]


def ending_cleanly() -> bool:
    """Say whether the caller ends normally: no exception in flight, or ``sys.exit(0)``."""
    return _normal(sys.exc_info()[1])


def _normal(exc: BaseException | None) -> bool:
    return exc is None or isinstance(exc, SystemExit) and exc.code in (None, 0)


def exiting_cleanly() -> bool:
    """Say, at interpreter exit, whether the program ended without an uncaught exception."""
    # The interpreter keeps the uncaught exception it printed (3.12+: also sys.last_exc).
    return getattr(sys, "last_value", None) is None and getattr(sys, "last_exc", None) is None


class ThreadCrash:
    """Note an uncaught exception that ends one thread, the training thread; undo it.

    At interpreter exit ``sys.last_value`` tells only of the main thread's uncaught exception.
    A training function run on a thread of its own (Ray Train's runner thread) that raises must
    not be taken for a clean end, so this chains ``threading.excepthook``, which the dying thread
    calls, where that thread is not the main thread.
    """

    def __init__(self, ident: int | None) -> None:
        self._ident = ident
        self._previous: Callable[[threading.ExceptHookArgs], object] | None = None
        #: Whether the thread ended on an uncaught exception (``sys.exit(0)`` is none).
        self.raised = False

    def install(self) -> ThreadCrash:
        """Chain the hook (once), unless the thread is the main thread; return self."""
        if self._previous is None and self._ident != threading.main_thread().ident:
            self._previous = threading.excepthook
            threading.excepthook = self._hook
        return self

    def uninstall(self) -> None:
        """Put the previous hook back, unless another was chained after this one (it stays)."""
        if self._previous is not None and threading.excepthook == self._hook:
            threading.excepthook = self._previous
            self._previous = None

    def _hook(self, args: threading.ExceptHookArgs) -> None:
        if threading.get_ident() == self._ident and not _normal(args.exc_value):
            self.raised = True
        previous = self._previous if self._previous is not None else threading.__excepthook__
        previous(args)


class End:
    """The moment this rank ended cleanly (Unix time), once it has."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.unix: float | None = None
        self._then: list[Callable[[], None]] = []

    def when_marked(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the clean end is marked, before anything waits on it.

        The callback runs on the thread that marks the end and must not raise.
        """
        with self._lock:
            self._then.append(callback)

    def mark(self) -> float:
        """Record the clean end now (the first call wins); return its time."""
        with self._lock:
            first = self.unix is None
            if self.unix is None:  # first; tested again so that the type checker sees a float
                self.unix = time.time()
            unix, then = self.unix, list(self._then) if first else []
        for callback in then:
            callback()
        return unix
