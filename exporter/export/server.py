"""Serve a registry over HTTP on a background thread, without ever failing training.

The server also remembers who scrapes it and how often (:class:`Scrapers`), so that a rank
ending cleanly can wait, briefly, until every scraper has read its final state.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app, start_http_server

from ..log import log
from ..settings import ADDR, DEFAULT_ADDR, PORT, WEB_CONFIG, Endpoint, is_all_interfaces
from ..web import Policy, WebServer

__all__ = ["MetricsServer", "Scrapers", "WSGIApp", "serve"]


#: A WSGI application: what :meth:`MetricsServer.route` mounts on a path.
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Scrapers:
    """Remember when each scraper last read ``/metrics`` and how often it does.

    A scraper is told apart by its address, user agent and Prometheus's scrape-timeout header:
    two Prometheus servers of one version on one host with one scrape config look like one.

    At most ``most`` scrapers are kept (the least recent one makes room), so a scan of the
    port cannot grow it.
    """

    def __init__(self, most: int = 16, clock: Callable[[], float] = time.monotonic) -> None:
        self._most = most
        self._clock = clock
        self._cond = threading.Condition()
        #: scraper -> (start of its last scrape, seconds between its last two scrapes or None)
        self._seen: dict[str, tuple[float, float | None]] = {}
        #: scraper -> start of its latest scrape that was answered (its body made)
        self._answered: dict[str, float] = {}

    def now(self) -> float:
        """Return the time on this tracker's clock (for :meth:`wait_after`)."""
        return self._clock()

    def scraped(self, who: str) -> float:
        """Note that ``who`` starts a scrape now; return the time."""
        now = self._clock()
        with self._cond:
            last = self._seen.pop(who, None)
            self._seen[who] = (now, now - last[0] if last else None)
            while len(self._seen) > self._most:
                oldest = next(iter(self._seen))
                self._seen.pop(oldest)
                self._answered.pop(oldest, None)
            self._cond.notify_all()
        return now

    def answered(self, who: str, started: float) -> None:
        """Note that ``who``'s scrape started at ``started`` (:meth:`scraped`) was answered."""
        with self._cond:
            if who in self._seen and started > self._answered.get(who, float("-inf")):
                self._answered[who] = started
            self._cond.notify_all()

    def _recent(self, since: float) -> dict[str, float]:
        return {
            who: last + 1.5 * interval
            for who, (last, interval) in self._seen.items()
            if interval is not None and since - last < 3 * interval
        }

    def recent(self, since: float) -> list[str]:
        """Return the scrapers :meth:`wait_after` would wait for, by name."""
        with self._cond:
            return sorted(self._recent(since))

    def wait_after(self, since: float, cap: float) -> tuple[bool, float]:
        """Wait until every recent scraper was answered a scrape begun at or after ``since``.

        At most ``cap`` s. A scraper is recent when it scraped twice and its last scrape is less
        than three of its intervals old; it is expected by its last scrape plus 1.5 intervals.
        Answered, not only begun: a process that exits once this returns must not cut off the
        scrape that reads its last state. Returns whether every recent scraper came, and the
        seconds waited (0 when nobody scrapes).
        """
        start = self._clock()
        with self._cond:
            recent = self._recent(since)
            if not recent:
                return True, 0.0
            end = min(start + cap, max(recent.values()))
            while True:
                missing = [who for who in recent if self._answered.get(who, -1.0) < since]
                now = self._clock()
                if not missing or now >= end:
                    return not missing, now - start
                self._cond.wait(end - now)


def _advice(exc: OSError) -> str:
    """Say which setting to change after a failed bind: the port where it is taken, else the
    address (not one of this host's, or not a name that resolves)."""
    if exc.errno in (errno.EADDRINUSE, errno.EACCES):
        return f"Choose another base port with port=... or {PORT}."
    return (
        f"Choose one of this host's addresses with addr=... or {ADDR} "
        f"(default: {DEFAULT_ADDR}, every interface)."
    )


class MetricsServer:
    """Serve ``/metrics`` for one registry; ``port`` is the bound port or None if none.

    Other paths can be mounted with :meth:`route` (the monitoring rank's ``/sd``); every path
    not mounted is answered by prometheus_client's own handler, as before. With ``web_config``
    (:mod:`exporter.web`) every path is served as that file says (TLS, basic authentication),
    or not at all.
    """

    def __init__(
        self, registry: CollectorRegistry, addr: str, port: int, *, web_config: str | None = None
    ) -> None:
        self._registry = registry
        self.addr = addr
        self.requested_port = port
        self.web_config = web_config
        #: The web configuration applied, once serving with one.
        self.policy: Policy | None = None
        self.port: int | None = None
        self._httpd: Any = None
        self._thread: Any = None
        self._routes: dict[str, WSGIApp] = {}
        #: Who scrapes ``/metrics`` (every path but the mounted ones) and how often.
        self.scrapers = Scrapers()

    @property
    def url(self) -> str | None:
        """Return the metrics URL (the host name when bound to every interface), None unbound."""
        if self.port is None:
            return None
        host = socket.gethostname() if is_all_interfaces(self.addr) else self.addr
        return f"{self.scheme}://{host}:{self.port}/metrics"

    @property
    def serving(self) -> bool:
        """Say whether scrapes are answered now: bound, and its web configuration (if any)
        can be served (a broken one is bound all the same, serving nothing until it is fixed)."""
        return self.port is not None and (self.policy is None or self.policy.current() is not None)

    @property
    def scheme(self) -> str:
        """Return ``https`` when the endpoint serves TLS, else ``http``."""
        return self.policy.scheme if self.policy is not None else "http"

    def route(self, path: str, app: WSGIApp) -> None:
        """Serve ``path`` with the WSGI ``app`` instead of the metrics handler."""
        self._routes[path] = app

    def _dispatch(self, metrics_app: WSGIApp) -> WSGIApp:
        routes, scrapers = self._routes, self.scrapers

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            handler = routes.get(environ.get("PATH_INFO", ""), None)
            if handler is not None:
                return handler(environ, start_response)
            # Noted before the registry is collected: this scrape reads the state from now on.
            who = (
                f"{environ.get('REMOTE_ADDR')} {environ.get('HTTP_USER_AGENT')} "
                f"{environ.get('HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS', '')}"
            )
            started = scrapers.scraped(who)
            try:
                return metrics_app(environ, start_response)  # the body is made here
            finally:
                scrapers.answered(who, started)

        return app

    def start(self) -> int | None:
        """Bind and serve; on a taken port or a web configuration that cannot be served, log
        one clear line and return None."""
        try:
            if self.web_config is not None:
                return self._start_secure(self.web_config)
            self._httpd, self._thread = start_http_server(
                self.requested_port, addr=self.addr, registry=self._registry
            )
        except OSError as exc:
            log.error(
                "ddp-exporter: cannot serve metrics on %s:%d (%s); training continues without "
                "this endpoint. %s",
                self.addr,
                self.requested_port,
                exc.strerror or exc,
                _advice(exc),
            )
            return None
        # Keep prometheus_client's server, thread and handler; only put a path switch in front.
        self._httpd.set_app(self._dispatch(self._httpd.get_app()))
        self.port = self._httpd.server_port
        return self.port

    def _start_secure(self, path: str) -> int | None:
        self.policy = policy = Policy(path)
        if policy.error is not None:
            # Bound all the same, serving nothing: a certificate written a moment later (by
            # cert-manager, say) is served from then on, never plain HTTP before it.
            log.error(
                "ddp-exporter: %s=%s: %s; nothing is served until it is fixed (never in the "
                "clear), training goes on",
                WEB_CONFIG,
                path,
                policy.error.removeprefix(f"{path}: "),
            )
        app = self._dispatch(make_wsgi_app(self._registry))
        httpd = WebServer(self.addr, self.requested_port, app, policy)
        thread = threading.Thread(
            target=httpd.serve_forever, name="ddp-exporter-https", daemon=True
        )
        thread.start()
        self._httpd, self._thread = httpd, thread
        self.port = httpd.server_port
        return self.port

    def close(self) -> None:
        """Stop serving; safe to call twice."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def release_after_fork(self) -> None:
        """In a process forked from the serving one: close the listening socket it inherited.

        Only this process's copy: the parent goes on serving. No shutdown(), which would wait
        for a serving thread that fork() did not copy. Without this, a forked child kept the
        port bound after the job ended, and a restarted job could not serve on it.
        """
        if self._httpd is not None:
            self._httpd.socket.close()
            self._httpd = None


def serve(registry: CollectorRegistry, endpoint: Endpoint) -> tuple[MetricsServer, int | None]:
    """Serve ``registry`` where ``endpoint`` says (its address, port and web configuration);
    return the server and the bound port (None when it could not bind: logged, training goes
    on)."""
    server = MetricsServer(registry, endpoint.addr, endpoint.port, web_config=endpoint.web_config)
    return server, server.start()
