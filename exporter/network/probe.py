"""Test, at run time, whether two ranks can still move bytes between their nodes.

In a hang where every rank waits inside a collective, every rank is alive and reaches the store,
but the collective cannot move bytes between some pair of peers. This probe tests exactly that,
beside the stuck collective and never through it: every rank listens on a side port at the
address its backend uses (:func:`exporter.network.netcheck.backend_address`), and the ranks the
monitoring rank names try their peers' listeners: connect, send a few KiB, read them back. A
pair that cannot connect, or connects but cannot move the bytes in time, is the broken link
(:mod:`exporter.network.judge` judges who failed against whom).

Cost: one listening socket per rank from the start (no thread, no traffic); its echo thread
starts only once the rank itself sits in a collective past half the stall threshold, and the
attempts run only when the monitoring rank asks, on a thread of their own, each bounded by
:data:`CONNECT_S` plus :data:`MOVE_S`. Nothing here touches the training thread or the
collectives.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ErrorCounter
from ..log import log
from . import netcheck
from .findings import PeerReach

__all__ = [
    "CONNECT_S",
    "KINDS",
    "MAX_WORKERS",
    "MOVE_S",
    "PAYLOAD_BYTES",
    "Listener",
    "reach",
    "reach_all",
]

#: How an attempt can end: connected and moved the bytes, or how it failed.
KINDS: tuple[str, ...] = (*netcheck.KINDS, "stalled", "reset")
#: Bytes each attempt sends and reads back: a few TCP segments, enough to need the path both
#: ways beyond the handshake, small enough never to matter to a link that works.
PAYLOAD_BYTES = 16 * 1024
#: Seconds an attempt may take to connect (a dropped SYN is retried at 1 s and 3 s) ...
CONNECT_S = 3.0
#: ... and then to send the payload and read it back.
MOVE_S = 3.0
#: Most attempts in flight at once, from one rank.
MAX_WORKERS = 64
#: Most connections the echo serves at once; more are closed at once.
MAX_CONNECTIONS = 256
_HEADER = struct.Struct("!I")


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def reach(
    address: str, connect_s: float = CONNECT_S, move_s: float = MOVE_S, payload: int = PAYLOAD_BYTES
) -> PeerReach:
    """Try ``address`` (``ip:port`` of a peer's :class:`Listener`): connect, send ``payload``
    bytes, read them back; say how it ended and how long it took. Never raises."""
    start = time.monotonic()
    try:
        host, port = _split(address)
    except ValueError:
        return PeerReach("unresolved", 0.0)
    sock, found = netcheck.connect(host, port, connect_s)
    if sock is None:
        return PeerReach(found.kind, time.monotonic() - start)
    data = bytes(payload)
    try:
        with sock:
            sock.settimeout(move_s)
            sock.sendall(_HEADER.pack(payload) + data)
            got = 0
            end = time.monotonic() + move_s
            while got < payload:
                sock.settimeout(max(0.01, end - time.monotonic()))
                chunk = sock.recv(min(65536, payload - got))
                if not chunk:
                    return PeerReach("reset", time.monotonic() - start)
                got += len(chunk)
    except TimeoutError:
        return PeerReach("stalled", time.monotonic() - start)
    except OSError:
        return PeerReach("reset", time.monotonic() - start)
    return PeerReach("ok", time.monotonic() - start)


def reach_all(
    targets: Mapping[int, str], connect_s: float = CONNECT_S, move_s: float = MOVE_S
) -> dict[int, PeerReach]:
    """Try every ``{rank: address}`` at once (:func:`reach`); bounded by one attempt's time."""
    return netcheck.at_once(
        lambda addr: reach(addr, connect_s, move_s), targets, MAX_WORKERS, "ddp-exporter-probe"
    )


@dataclass
class _Conn:
    """One peer's attempt, as the echo serves it."""

    sock: socket.socket
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    want: int | None = None
    outbox: memoryview | None = None


class Listener:
    """Listen where the backend talks to peers; echo what a peer's :func:`reach` sends.

    The socket listens from the start, so that a peer's connection is accepted by the kernel
    even before :meth:`serve` starts the echo (it reads it then); the echo runs on one daemon
    thread, serves every connection without blocking on any (a selector) and drops one that
    takes longer than an attempt may.
    """

    def __init__(self, host: str, errors: ErrorCounter) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.bind((host, 0))
            self._sock.listen(128)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        port = self._sock.getsockname()[1]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._errors = errors
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def serving(self) -> bool:
        """Say whether the echo runs."""
        return self._thread is not None

    def serve(self) -> None:
        """Start the echo (once; it then runs until :meth:`close`)."""
        if self._thread is not None or self._closed.is_set():
            return
        self._thread = threading.Thread(
            target=self._run, name="ddp-exporter-probe-echo", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop listening (the echo thread ends within its poll)."""
        self._closed.set()
        if self._thread is None:
            self._sock.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        conns: dict[int, _Conn] = {}
        try:
            sel.register(self._sock, selectors.EVENT_READ)
            while not self._closed.is_set():
                for key, _ in sel.select(timeout=0.5):
                    if key.fileobj is self._sock:
                        self._accept(sel, conns)
                    else:
                        self._step(sel, conns, conns[key.fd])
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline < now]:
                    self._drop(sel, conns, conn)
        except Exception as exc:  # noqa: BLE001 - the probe is a courtesy; training goes on
            self._errors.record("forensics", exc)
            log.warning("ddp-exporter: the hang probe's listener stopped: %r", exc)
        finally:
            for conn in list(conns.values()):
                self._drop(sel, conns, conn)
            sel.close()
            self._sock.close()

    def _accept(self, sel: selectors.BaseSelector, conns: dict[int, _Conn]) -> None:
        try:
            sock, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        if len(conns) >= MAX_CONNECTIONS:
            sock.close()
            return
        sock.setblocking(False)
        conn = _Conn(sock, time.monotonic() + 2 * (CONNECT_S + MOVE_S))
        conns[sock.fileno()] = conn
        sel.register(sock, selectors.EVENT_READ)

    def _step(self, sel: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn) -> None:
        """Read the header and the payload, then write it back; drop the connection when done."""
        try:
            if conn.outbox is None:
                chunk = conn.sock.recv(65536)
                if not chunk:
                    self._drop(sel, conns, conn)
                    return
                conn.inbox += chunk
                if conn.want is None and len(conn.inbox) >= _HEADER.size:
                    (conn.want,) = _HEADER.unpack_from(conn.inbox)
                    del conn.inbox[: _HEADER.size]
                    if conn.want > 4 * PAYLOAD_BYTES:  # not a peer's probe: no echo
                        self._drop(sel, conns, conn)
                        return
                if conn.want is not None and len(conn.inbox) >= conn.want:
                    conn.outbox = memoryview(bytes(conn.inbox[: conn.want]))
                    sel.modify(conn.sock, selectors.EVENT_WRITE)
                return
            sent = conn.sock.send(conn.outbox)
            conn.outbox = conn.outbox[sent:]
            if not len(conn.outbox):
                self._drop(sel, conns, conn)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sel, conns, conn)

    @staticmethod
    def _drop(sel: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn) -> None:
        conns.pop(conn.sock.fileno(), None)
        try:
            sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
