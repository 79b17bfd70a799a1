"""Serve a WSGI application as a web configuration says: TLS, client certificates, basic auth.

The TLS handshake runs on the connection's own thread, not on the thread that accepts; every
read has a timeout and every connection a deadline, and at most :data:`MAX_CONNECTIONS` are
served at once: a client that connects and says nothing, or says it slowly, holds one slot for
seconds, never the endpoint. A plain HTTP request to the TLS port gets a plain ``400`` saying so, as Go's servers
answer it; a failed handshake, an untrusted or missing client certificate and a client name not
allowed get nothing; a request without the right credentials gets ``401``.
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from .policy import Policy
from .tls import allowed_client

__all__ = ["CONNECTION_S", "HANDSHAKE_S", "MAX_CONNECTIONS", "WebServer"]

#: Seconds a connection may wait for each read (the handshake's, the request's).
HANDSHAKE_S = 10.0
#: Seconds a connection may last in all: one sending a byte every few seconds is cut there.
CONNECTION_S = 30.0
#: Connections served at once; one more is closed at once (a scraper needs one per scrape).
MAX_CONNECTIONS = 32

_TLS_HANDSHAKE = 0x16
_PLAIN_TO_TLS = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
)


def _shut(live: list[socket.socket]) -> None:
    """Shut the connection's socket down (the TLS one once wrapped): its reads return."""
    try:
        live[0].shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: a closed socket object never reaches another connection


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Log nothing: a scrape every few seconds is not news."""


def _family(addr: str, port: int) -> socket.AddressFamily:
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return socket.AF_INET
    return infos[0][0] if infos else socket.AF_INET


class WebServer(ThreadingMixIn, WSGIServer):
    """A threading WSGI server applying ``policy`` to every connection and request.

    ``connection_s``: how long one connection may last; ``most``: how many are served at once.
    """

    daemon_threads = True

    def __init__(
        self,
        addr: str,
        port: int,
        app: Callable[..., Any],
        policy: Policy,
        *,
        connection_s: float = CONNECTION_S,
        most: int = MAX_CONNECTIONS,
    ) -> None:
        self.address_family = _family(addr, port)
        self.policy = policy
        self._connection_s = connection_s
        self._slots = threading.BoundedSemaphore(most)
        #: The socket each connection's thread serves now (``live``: the deadline's target).
        self._local = threading.local()
        super().__init__((addr, port), _Quiet)
        self.set_app(self._guard(app))

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` on a thread of its own, or close it when every slot is taken."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection within ``connection_s`` seconds, then free its slot."""
        # Shutting the socket down wakes a read blocked on it: the connection ends there.
        self._local.live = live = [request]
        cut = threading.Timer(self._connection_s, _shut, args=(live,))
        cut.daemon = True
        cut.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            cut.cancel()
            self._slots.release()

    def _guard(self, app: Callable[..., Any]) -> Callable[..., Iterable[bytes]]:
        policy = self.policy

        def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            served = policy.current()
            if served is None:
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"The web configuration cannot be served.\n"]
            if served.auth is not None and not served.auth.allows(
                environ.get("HTTP_AUTHORIZATION")
            ):
                start_response(
                    "401 Unauthorized",
                    [
                        ("Content-Type", "text/plain; charset=utf-8"),
                        ("WWW-Authenticate", 'Basic realm="ddp-exporter", charset="UTF-8"'),
                    ],
                )
                return [b"Unauthorized\n"]
            return app(environ, start_response)

        return guarded

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Print a server error, except a connection a client broke (a reset, bad TLS)."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Serve one connection: over TLS first where the configuration asks for it."""
        served = self.policy.current()
        if served is None:
            return
        request.settimeout(HANDSHAKE_S)
        if served.context is None or served.config.tls is None:
            super().finish_request(request, client_address)
            return
        try:
            first = request.recv(1, socket.MSG_PEEK)
            if first and first[0] != _TLS_HANDSHAKE:
                request.sendall(_PLAIN_TO_TLS)
                return
            if not first:
                return
            conn = served.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return  # a failed handshake: an untrusted or missing client certificate, a scan
        live = getattr(self._local, "live", None)
        if live is not None:
            live[0] = conn  # the TLS socket now holds the connection; the plain one is detached
        try:
            if allowed_client(conn.getpeercert(), served.config.tls.client_allowed_sans):
                super().finish_request(conn, client_address)
        finally:
            conn.close()
