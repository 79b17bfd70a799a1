"""Run the exporter's periodic work on daemon threads that never break training.

Every background activity of the exporter (heartbeats, discovery refresh, hang watching, OTLP
pushes, CUDA-event resolution, the init watch) is one :class:`BackgroundLoop`: a daemon thread
that calls ``tick`` between stop-aware waits, counts an exception in the rank's error counter
and goes on, and is closed with a bounded join (the thread may be stuck on a dead store; being
a daemon it then dies with the process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .errors import ErrorCounter

__all__ = ["DONE", "BackgroundLoop"]

#: What ``tick`` returns to end the loop (its ``final`` still runs).
DONE: Any = object()


class BackgroundLoop:
    """Call ``tick`` every ``interval_s`` seconds on a daemon thread until closed.

    ``tick`` returns None (wait ``interval_s`` before the next tick), a number of seconds (wait
    that long instead), or :data:`DONE` (end the loop). An exception is recorded in ``errors``
    under ``where`` and the loop goes on after the same wait as before. ``final`` runs once on
    the thread when the loop ends, by :data:`DONE` or by :meth:`stop`. The first tick comes
    after ``first_wait`` seconds (default ``interval_s``).
    """

    def __init__(
        self,
        name: str,
        tick: Callable[[], Any],
        interval_s: float,
        *,
        errors: ErrorCounter,
        where: str,
        final: Callable[[], None] | None = None,
        first_wait: float | None = None,
    ) -> None:
        self.interval_s = interval_s
        self._tick = tick
        self._errors = errors
        self._where = where
        self._final = final
        self._first_wait = interval_s if first_wait is None else first_wait
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> BackgroundLoop:
        """Start the thread; return self."""
        self._thread.start()
        return self

    @property
    def started(self) -> bool:
        """Say whether :meth:`start` ran."""
        return self._thread.ident is not None

    @property
    def stopping(self) -> bool:
        """Say whether :meth:`stop` was called."""
        return self._stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` inside a tick; return True when the loop is being stopped."""
        return self._stop.wait(seconds)

    def _run(self) -> None:
        wait = self._first_wait
        try:
            # A wait past the platform's limit would raise and end the thread for good.
            while not self._stop.wait(min(wait, threading.TIMEOUT_MAX)):
                try:
                    result = self._tick()
                except Exception as exc:  # noqa: BLE001 - the exporter must never raise
                    self._errors.record(self._where, exc)
                    continue
                if result is DONE:
                    return
                wait = self.interval_s if result is None else result
        finally:
            if self._final is not None:
                try:
                    self._final()
                except Exception as exc:  # noqa: BLE001
                    self._errors.record(self._where, exc)

    def stop(self) -> None:
        """Ask the loop to end after its current tick, without waiting for it."""
        self._stop.set()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the loop and wait up to ``timeout`` seconds for its thread to end."""
        self._stop.set()
        if self.started and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def alive(self) -> bool:
        """Say whether the thread still runs."""
        return self._thread.is_alive()
