"""Hold the web configuration a server applies now, re-read when one of its files changes.

As exporter-toolkit re-reads its file for every connection, so that a renewed certificate is
served without a restart: here the file and every file it names are looked at (``stat``) at most
once a second, and read again when one changed. A file that breaks while the job runs is logged
once, and nothing is served until it is fixed: never the clear text it was meant to prevent.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..log import log
from .auth import BasicAuth
from .config import WebConfig, load
from .tls import server_context

__all__ = ["Policy", "Served", "prepare"]

#: Seconds between two looks at the files.
RECHECK_S = 1.0


@dataclass(frozen=True)
class Served:
    """A web configuration ready to serve: its TLS context and its users' check."""

    config: WebConfig
    context: ssl.SSLContext | None
    auth: BasicAuth | None


def prepare(path: str) -> Served:
    """Read the file at ``path`` and build what serving it needs.

    Raises :class:`~exporter.web.config.WebConfigError` naming the field at fault, ImportError
    naming the extra for a missing PyYAML or bcrypt.
    """
    config = load(path)
    context = server_context(config.tls, path) if config.tls is not None else None
    return Served(config, context, BasicAuth(config.users) if config.users else None)


def _stamp(files: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for name in files:
        try:
            st = os.stat(name)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class Policy:
    """What to serve now, from the web configuration file at ``path``.

    :meth:`current` is None while the file cannot be served; :attr:`error` then says why. The
    file is read once here (a caller logs :attr:`error` its own way); later a change, or for a
    broken file any look, reads it again, and a break or a recovery is logged once.
    """

    def __init__(
        self,
        path: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.path = path
        self._clock, self._recheck_s = clock, recheck_s
        self._lock = threading.Lock()
        self._served: Served | None = None
        #: Why the file cannot be served, None while it is.
        self.error: str | None = None
        self._files: tuple[str, ...] = (path,)
        self._stamp: tuple[tuple[int, int, int] | None, ...] = ()
        self._load()
        self._checked = clock()

    @property
    def scheme(self) -> str:
        """Return ``https`` or ``http`` as the file says; ``https`` while it cannot be read."""
        with self._lock:
            served = self._served
        return served.config.scheme if served is not None else "https"

    def _load(self) -> None:
        # The stamp is taken before the read: a write during it is seen at the next look.
        before = _stamp(self._files)
        try:
            served = prepare(self.path)
        except Exception as exc:  # noqa: BLE001 - whatever breaks, serve nothing, never raise
            self._served, self.error, self._stamp = None, str(exc), before
            return
        files = served.config.files()
        # Other files named now: their stamp is unknown, so the next look reads again.
        self._stamp = before if files == self._files else ()
        self._served, self.error, self._files = served, None, files

    def current(self) -> Served | None:
        """Return what to serve, re-reading the file when it changed (or is broken)."""
        with self._lock:
            now = self._clock()
            if now - self._checked < self._recheck_s:
                return self._served
            self._checked = now
            if self._served is not None and _stamp(self._files) == self._stamp:
                return self._served
            was = self.error
            self._load()
            if self.error is not None and self.error != was:
                log.error(
                    "ddp-exporter: web configuration %s; serving nothing until it is "
                    "fixed, training goes on",
                    self.error,
                )
            elif self.error is None and was is not None:
                log.warning("ddp-exporter: web configuration %s fixed: serving again", self.path)
            return self._served
