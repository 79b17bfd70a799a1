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
    """What to serve now: :meth:`current` is None while the file is broken."""

    def __init__(
        self,
        served: Served,
        *,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.path = served.config.path
        self._clock, self._recheck_s = clock, recheck_s
        self._lock = threading.Lock()
        self._served: Served | None = served
        self._files = served.config.files()
        self._stamp = _stamp(self._files)
        self._checked = clock()
        self._logged = ""

    @property
    def scheme(self) -> str:
        """Return ``https`` or ``http``, as the file read last says."""
        with self._lock:
            served = self._served
        return served.config.scheme if served is not None else "https"

    def current(self) -> Served | None:
        """Return what to serve, re-reading the files when one changed since the last look."""
        with self._lock:
            now = self._clock()
            if now - self._checked < self._recheck_s:
                return self._served
            self._checked = now
            stamp = _stamp(self._files)
            if stamp == self._stamp:
                return self._served
            try:
                served = prepare(self.path)
            except Exception as exc:  # noqa: BLE001 - whatever breaks, serve nothing, never raise
                self._stamp, self._served = stamp, None
                if str(exc) != self._logged:
                    self._logged = str(exc)
                    log.error(
                        "ddp-exporter: web configuration %s; serving nothing until it is "
                        "fixed, training goes on",
                        exc,
                    )
                return None
            self._served, self._logged = served, ""
            self._files = served.config.files()
            self._stamp = _stamp(self._files)
            return served
