"""Serve a registry over HTTP on a background thread, without ever failing training."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from ..log import log

__all__ = ["MetricsServer", "WSGIApp"]


#: A WSGI application: what :meth:`MetricsServer.route` mounts on a path.
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class MetricsServer:
    """Serve ``/metrics`` for one registry; ``port`` is the bound port or None if none.

    Other paths can be mounted with :meth:`route` (the monitoring rank's ``/sd``); every path
    not mounted is answered by prometheus_client's own handler, as before.
    """

    def __init__(self, registry: CollectorRegistry, addr: str, port: int) -> None:
        self._registry = registry
        self.addr = addr
        self.requested_port = port
        self.port: int | None = None
        self._httpd: Any = None
        self._thread: Any = None
        self._routes: dict[str, WSGIApp] = {}

    def route(self, path: str, app: WSGIApp) -> None:
        """Serve ``path`` with the WSGI ``app`` instead of the metrics handler."""
        self._routes[path] = app

    def _dispatch(self, metrics_app: WSGIApp) -> WSGIApp:
        routes = self._routes

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            handler = routes.get(environ.get("PATH_INFO", ""), metrics_app)
            return handler(environ, start_response)

        return app

    def start(self) -> int | None:
        """Bind and serve; on a taken port log one clear line and return None."""
        try:
            self._httpd, self._thread = start_http_server(
                self.requested_port, addr=self.addr, registry=self._registry
            )
        except OSError as exc:
            log.error(
                "ddp-exporter: cannot serve metrics on %s:%d (%s); training continues without "
                "this endpoint. Choose another base port with port=... or DDP_EXPORTER_PORT.",
                self.addr,
                self.requested_port,
                exc.strerror or exc,
            )
            return None
        # Keep prometheus_client's server, thread and handler; only put a path switch in front.
        self._httpd.set_app(self._dispatch(self._httpd.get_app()))
        self.port = self._httpd.server_port
        return self.port

    def close(self) -> None:
        """Stop serving; safe to call twice."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
