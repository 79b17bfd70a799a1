"""Ask NCCL's RAS what it knows of a hung job, where it runs: a few lines for the verdict.

NCCL 2.24 and later run a RAS thread in every process that keeps its peers' liveness and
answers a text client on ``localhost:28028`` (``NCCL_RAS_ADDR`` moves it; ``NCCL_RAS_ENABLE=0``
turns it off): the ``ncclras`` tool. The exchange is NCCL's client protocol: ``CLIENT PROTOCOL
2``, answered ``SERVER PROTOCOL N``; ``TIMEOUT S``, answered ``OK``; then ``STATUS``, answered
with a report until the connection closes. It is not a stable API: whatever fails (no RAS,
another protocol, no answer in time) gives no lines and the verdict goes without.

The monitoring rank asks once per hang episode, whatever kind and however many nodes, on a
thread of its own (:class:`Asking`): RAS knows which NCCL processes are dead or unresponsive even
where no link between nodes can be probed (a job on one node).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping

__all__ = [
    "DEFAULT_ADDRESS",
    "PROTOCOL",
    "Asking",
    "interesting",
    "query",
    "ras_address",
    "report",
]

#: Where NCCL's RAS client socket listens by default.
DEFAULT_ADDRESS = ("localhost", 28028)
#: The client protocol version sent (NCCL answers with its own and goes on).
PROTOCOL = 2
#: Words of a RAS report line worth a verdict line.
_WORDS = (
    "dead",
    "unresponsive",
    "not respond",
    "missing",
    "error",
    "mismatch",
    "incomplete",
    "timeout",
    "timed out",
    "fail",
)
#: Lines kept, and characters per line.
MAX_LINES = 6
MAX_CHARS = 200


def ras_address(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """Return where this process's RAS answers (None: turned off)."""
    env = os.environ if environ is None else environ
    if env.get("NCCL_RAS_ENABLE", "1").strip() == "0":
        return None
    raw = env.get("NCCL_RAS_ADDR", "").strip()
    if not raw:
        return DEFAULT_ADDRESS
    host, _, port = raw.rpartition(":")
    try:
        return (host or "localhost").strip("[]"), int(port)
    except ValueError:
        return None


def interesting(report: str) -> tuple[str, ...]:
    """Return the lines of a RAS report that say something is wrong (at most ``MAX_LINES``)."""
    out = []
    for line in report.splitlines():
        text = " ".join(line.split())
        low = text.lower()
        # Headings ("Errors") and all-clear lines ("No errors") say nothing wrong.
        if len(text.split()) < 3 or low.startswith(("no ", "0 ")):
            continue
        if any(w in low for w in _WORDS):
            out.append(text[:MAX_CHARS])
        if len(out) >= MAX_LINES:
            break
    return tuple(out)


def _line(sock: socket.socket, end: float) -> str:
    data = b""
    while not data.endswith(b"\n"):
        sock.settimeout(max(0.01, end - time.monotonic()))
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def report(
    address: tuple[str, int] | None = DEFAULT_ADDRESS, seconds: float = 8.0, peer_timeout_s: int = 3
) -> str:
    """Return RAS's whole status report, within ``seconds`` (``""``: it did not answer)."""
    if address is None:
        return ""
    end = time.monotonic() + seconds
    try:
        with socket.create_connection(address, timeout=min(1.0, seconds)) as sock:
            sock.sendall(f"CLIENT PROTOCOL {PROTOCOL}\n".encode())
            if not _line(sock, end).upper().startswith("SERVER PROTOCOL"):
                return ""
            sock.sendall(f"TIMEOUT {peer_timeout_s}\n".encode())
            if _line(sock, end).strip().upper() != "OK":
                return ""
            sock.sendall(b"STATUS\n")
            got = b""
            while time.monotonic() < end and len(got) < 1 << 20:
                sock.settimeout(max(0.01, end - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                got += chunk
    except OSError:
        return ""
    return got.decode(errors="replace")


def query(
    address: tuple[str, int] | None = DEFAULT_ADDRESS, seconds: float = 8.0, peer_timeout_s: int = 3
) -> tuple[str, ...]:
    """Return what RAS reports as wrong, within ``seconds``; none when it does not answer."""
    return interesting(report(address, seconds, peer_timeout_s))


class Asking:
    """Ask RAS on a thread of its own; its lines once it answered or its time ran out."""

    def __init__(self, address: tuple[str, int], seconds: float = 8.0) -> None:
        self._got: list[tuple[str, ...]] = []
        # The query bounds itself by ``seconds``; the slack covers starting the thread.
        self._end = time.monotonic() + seconds + 1.0
        threading.Thread(
            target=lambda: self._got.append(query(address, seconds)),
            name="ddp-exporter-ras",
            daemon=True,
        ).start()

    def done(self) -> bool:
        """Say whether the answer is in, or no longer worth waiting for."""
        return bool(self._got) or time.monotonic() >= self._end

    def lines(self) -> tuple[str, ...]:
        """Return what RAS reported as wrong (none: nothing, or no answer yet)."""
        return self._got[0] if self._got else ()
