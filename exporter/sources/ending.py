"""Tell a clean end of training from a crash, and keep the time of a clean one.

A job has edges, and its end is one: a rank that ends cleanly publishes
``ddp_finished_timestamp_seconds`` in its final scrapes, so that the rules tell a finished job
from a killed one. What counts as clean:

- :func:`exporter.Observer.close` called while no exception is propagating (``try: train()
  finally: obs.close()`` after a normal return, a framework's end-of-training callback), or
  while ``sys.exit(0)`` is;
- the interpreter's exit (the exporter's ``atexit`` handler) when no uncaught exception ended
  the program.

Not clean: ``close()`` from a ``finally`` or ``except`` block while an error propagates, an
uncaught exception, and any death without Python's exit (SIGKILL, SIGTERM's default action, a
segfault, torchrun stopping the survivors of a failed attempt), which never reaches the exporter.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

__all__ = ["End", "ending_cleanly", "exiting_cleanly"]


def ending_cleanly() -> bool:
    """Say whether the caller ends normally: no exception in flight, or ``sys.exit(0)``."""
    exc = sys.exc_info()[1]
    return exc is None or isinstance(exc, SystemExit) and exc.code in (None, 0)


def exiting_cleanly() -> bool:
    """Say, at interpreter exit, whether the program ended without an uncaught exception."""
    # The interpreter keeps the uncaught exception it printed (3.12+: also sys.last_exc).
    return getattr(sys, "last_value", None) is None and getattr(sys, "last_exc", None) is None


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
