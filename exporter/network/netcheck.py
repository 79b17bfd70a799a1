"""Tell why one machine cannot reach another: refused, dropped, unreachable, or not even resolved.

Shared by ``ddp-exporter doctor`` and the init watch, so that both name the same fault with the
same words and the same fix. A TCP connect says a lot by how it fails: ``refused`` (the host
answered, nothing listens on the port), ``dropped`` (no answer at all until the deadline: a
firewall that DROPs, or a host that is down), ``unreachable`` (no route, or the address answers
no ARP: a wrong address), ``unresolved`` (the name does not resolve on this node).

:func:`gloo_address` finds the address gloo would advertise for this rank (its
``GLOO_SOCKET_IFNAME`` interface's, else the hostname's), which its peers must be able to reach
on any port: the doctor listens there and has every rank try every other.
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "KINDS",
    "Reach",
    "at_once",
    "backend_address",
    "connect",
    "explain_master",
    "gloo_address",
    "interface_address",
    "is_loopback",
    "listen",
    "probe_all",
    "probe_tcp",
    "resolve",
]

#: How a connection attempt can end.
KINDS: tuple[str, ...] = ("ok", "refused", "dropped", "unreachable", "unresolved")

_T = TypeVar("_T")
_SIOCGIFADDR = 0x8915
_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL}


@dataclass(frozen=True)
class Reach:
    """The outcome of trying to connect to ``host:port`` for a while."""

    host: str
    port: int
    #: One of :data:`KINDS`.
    kind: str
    #: The address ``host`` resolved to here ("" when it did not).
    ip: str = ""
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        """Say whether a connection was made."""
        return self.kind == "ok"

    def where(self) -> str:
        """Return ``host:port`` with the address it resolved to, e.g. ``node0:29500 (10.0.0.1)``."""
        addr = f" ({self.ip})" if self.ip and self.ip != self.host else ""
        return f"{self.host}:{self.port}{addr}"


def resolve(host: str) -> str | None:
    """Return the first IPv4/IPv6 address ``host`` resolves to here, None when it does not."""
    try:
        # An IP family's address is a string (typeshed also allows the int of other families).
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError:
        return None


def connect(
    host: str, port: int, seconds: float, retry_s: float = 0.2
) -> tuple[socket.socket | None, Reach]:
    """Connect to ``host:port``, retrying a refusal until ``seconds`` passed; return the open
    socket (None when it failed) and how the attempt ended.

    A refused connection is retried (the listener may start late); an unanswered one is the
    firewall's DROP or a dead host; no route or no ARP answer is an unreachable address.
    """
    ip = resolve(host)
    if ip is None:
        return None, Reach(host, port, "unresolved")
    start = time.monotonic()
    end = start + seconds
    kind, error = "dropped", ""
    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            # Long enough for a failed ARP resolution (3 s) to say "unreachable", not "dropped".
            sock = socket.create_connection((ip, port), timeout=min(4.0, left))
            return sock, Reach(host, port, "ok", ip, time.monotonic() - start)
        except ConnectionRefusedError as exc:
            kind, error = "refused", str(exc)
        except TimeoutError as exc:
            kind, error = "dropped", str(exc) or "timed out"
        except OSError as exc:
            if exc.errno in _UNREACHABLE:  # no route, or no ARP answer: retrying will not help
                return None, Reach(
                    host, port, "unreachable", ip, time.monotonic() - start, str(exc)
                )
            kind, error = "dropped", str(exc)
        time.sleep(min(retry_s, max(0.0, end - time.monotonic())))
    return None, Reach(host, port, kind, ip, time.monotonic() - start, error)


def probe_tcp(host: str, port: int, seconds: float, retry_s: float = 0.2) -> Reach:
    """Try to connect to ``host:port`` until it works or ``seconds`` passed; say how it failed
    (:func:`connect`, the connection closed at once)."""
    sock, found = connect(host, port, seconds, retry_s)
    if sock is not None:
        sock.close()
    return found


def at_once(
    attempt: Callable[[str], _T], targets: Mapping[int, str], workers: int, name: str
) -> dict[int, _T]:
    """Run ``attempt(address)`` for every ``{member: address}`` at once, on at most ``workers``
    threads named ``name``; return each member's result (bounded by the slowest attempt)."""
    if not targets:
        return {}
    with ThreadPoolExecutor(
        max_workers=min(workers, len(targets)), thread_name_prefix=name
    ) as pool:
        futures = {member: pool.submit(attempt, address) for member, address in targets.items()}
        return {member: f.result() for member, f in futures.items()}


def probe_all(targets: Mapping[int, str], seconds: float, workers: int = 32) -> dict[int, str]:
    """Try every ``{member: "host:port"}`` at once (:func:`probe_tcp`, each for ``seconds``);
    return how each attempt ended (:data:`KINDS`); an empty address is ``unresolved``."""

    def attempt(address: str) -> str:
        if not address:
            return "unresolved"
        host, _, port = address.rpartition(":")
        return probe_tcp(host.strip("[]"), int(port), seconds).kind

    return at_once(attempt, targets, workers, "ddp-exporter-reach")


def listen(addr: str, backlog: int = 64) -> str:
    """Listen on ``addr`` (a free port) and accept, then close, every connection on a daemon
    thread, for as long as the process lives; return ``ip:port``. Raises OSError.

    What a peer's :func:`probe_tcp` needs to say ``ok``: an address the backend would use that
    takes connections.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    try:
        sock.bind((addr, 0))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
                conn.close()
            except OSError:
                return

    threading.Thread(target=accept, name="ddp-exporter-listen", daemon=True).start()
    return f"{addr}:{sock.getsockname()[1]}"


def interface_address(name: str) -> str | None:
    """Return the IPv4 address of interface ``name``, None when it has none (or no such one)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = struct.pack("256s", name.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, packed)[20:24])
    except OSError:
        return None


def gloo_address(environ: Mapping[str, str]) -> tuple[str, str]:
    """Return ``(address, why)``: where gloo listens on this rank, and what chose it.

    As gloo's default device does: ``GLOO_SOCKET_IFNAME`` (its first interface) when set, else
    the address the hostname resolves to, even a loopback one (Debian's ``127.0.1.1``: the
    other nodes cannot reach it, a classic cause of ``connectFullMesh`` failures), else
    loopback.
    """
    names = [n for n in environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    if names:
        addr = interface_address(names[0])
        if addr:
            return addr, f"GLOO_SOCKET_IFNAME={names[0]}"
    host = socket.gethostname()
    addr = resolve(host)
    if addr:
        return addr, f"the hostname {host}"
    return "127.0.0.1", f"loopback (the hostname {host} does not resolve)"


def _nccl_interface(value: str, names: list[str]) -> str | None:
    """Return the first of ``names`` that ``NCCL_SOCKET_IFNAME=value`` selects and has an address.

    NCCL's syntax: a comma-separated list of prefixes, or of exact names after ``=``; a list
    after ``^`` excludes (not followed here: the caller falls back to gloo's choice).
    """
    if not value or value.startswith("^"):
        return None
    exact = value.startswith("=")
    wanted = [w for w in value.lstrip("=").split(",") if w]
    for name in names:
        if any(name == w if exact else name.startswith(w) for w in wanted):
            addr = interface_address(name)
            if addr:
                return addr
    return None


def backend_address(environ: Mapping[str, str], backend: str) -> tuple[str, str]:
    """Return ``(address, why)``: where this rank's collectives backend talks to its peers.

    NCCL: its ``NCCL_SOCKET_IFNAME`` interface's address (the sockets it bootstraps on, and its
    data path over TCP; an InfiniBand or RoCE data path has no such address). Gloo, and NCCL
    without the variable: :func:`gloo_address`.
    """
    if "nccl" in backend.lower():
        value = environ.get("NCCL_SOCKET_IFNAME", "")
        try:
            names = [name for _, name in socket.if_nameindex()]
        except OSError:
            names = []
        addr = _nccl_interface(value, names)
        if addr:
            return addr, f"NCCL_SOCKET_IFNAME={value}"
    return gloo_address(environ)


def is_loopback(addr: str) -> bool:
    """Say whether ``addr`` is a loopback address (127.0.0.0/8 or ::1)."""
    return addr.startswith("127.") or addr == "::1"


def explain_master(found: Reach, here: str) -> tuple[str, str]:
    """Return ``(what happened, the fix)`` for a failed connection to MASTER_ADDR:MASTER_PORT.

    ``here`` is this node's name: the fault is seen from where the rank stands (another node
    may resolve or reach the master fine).
    """
    where = f"MASTER_ADDR:MASTER_PORT {found.where()}"
    if found.kind == "unresolved":
        return (
            f"MASTER_ADDR {found.host} does not resolve on {here}",
            f"make {found.host} resolve on {here} (DNS, /etc/hosts), or set MASTER_ADDR to "
            "rank 0's IP address",
        )
    if found.kind == "refused":
        return (
            f"{where} refused connections for {found.seconds:.0f} s",
            "nothing listens there: check that rank 0 started and that every rank has rank 0's "
            "MASTER_ADDR and MASTER_PORT",
        )
    if found.kind == "unreachable":
        return (
            f"{where} is unreachable from {here} ({found.error}): MASTER_ADDR resolves to "
            f"{found.ip} here",
            f"make MASTER_ADDR resolve to rank 0's node on every node (DNS, /etc/hosts on "
            f"{here}), or set it to rank 0's IP address",
        )
    return (
        f"{where}: no answer within {found.seconds:.0f} s from {here} (connections dropped)",
        f"open TCP port {found.port} on {found.host} to the other nodes (its firewall, a "
        "security group), or choose a MASTER_PORT that is open",
    )
