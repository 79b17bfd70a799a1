"""Catch exporter errors so training never breaks: log each place once, count every one."""

from __future__ import annotations

import threading

from . import catalog
from .log import log

__all__ = ["ErrorCounter"]


class ErrorCounter:
    """Count exporter errors by place and log the first of each place with its traceback."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = dict.fromkeys(catalog.ERROR_WHERE, 0)
        self._logged: set[str] = set()

    def record(self, where: str, exc: BaseException) -> None:
        """Record one error at ``where``; never raises."""
        with self._lock:
            if where not in self.counts:
                where = "collect"
            self.counts[where] += 1
            first = where not in self._logged
            self._logged.add(where)
        if first:
            log.warning(
                "ddp-exporter: error in %s (training continues; further errors here are only "
                "counted in %s): %r",
                where,
                catalog.EXPORTER_ERRORS.name,
                exc,
            )
            # The traceback only on request: one line per place is the promise.
            log.debug("ddp-exporter: traceback of the first error in %s", where, exc_info=exc)

    def merge(self, other: ErrorCounter) -> None:
        """Add ``other``'s counts to these (a handle taking over another's endpoint)."""
        for where, n in other.snapshot().items():
            with self._lock:
                self.counts[where] = self.counts.get(where, 0) + n

    def snapshot(self) -> dict[str, int]:
        """Return a copy of the counts."""
        with self._lock:
            return dict(self.counts)
