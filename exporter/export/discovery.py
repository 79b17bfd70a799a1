"""Let Prometheus find every rank from the job itself: ``/sd`` on the monitoring rank, or file_sd.

Registration: at start-up each rank appends one line, its target group as JSON, to a single
c10d store key per run (``Store.append``: one write per rank, atomic at the store).
One key rather than one key per rank because ``get``/``multi_get`` block until every key
exists: a single appended key can be read whole at any time, so the list grows as ranks
register instead of staying empty until the last one has.

Serving: the monitoring rank reads that key once a second (one ``get``; backing off to every
16 s while nothing new arrives) until every rank has registered, parses only the lines appended
since its last read, and keeps the Prometheus HTTP service discovery answer (``http_sd_configs``: a list
of ``{"targets": [...], "labels": {...}}``) ready in memory, plain and gzipped; a request for
``/sd`` never touches the store. A rank that dies stays in the list, so its failed scrapes
(``up == 0``) page for it. When the monitoring rank itself dies, ``/sd`` is unreachable and
Prometheus keeps the targets of its last successful refresh.

``DDP_EXPORTER_FILE_SD=DIR`` makes every rank also write its own file_sd target file into DIR
(atomically; removed when the rank closes cleanly, kept when it dies).

The advertised address is ``DDP_EXPORTER_ADVERTISE_ADDR`` when set, else the bind address
when it names one interface, else an address other nodes can reach (:func:`advertise_host`).
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import os
import re
import socket
from collections.abc import Mapping
from typing import Any

from .. import settings, storekeys
from ..background import DONE, BackgroundLoop
from ..errors import ErrorCounter
from ..storekeys import Keys

__all__ = [
    "MAX_REFRESH_S",
    "REFRESH_S",
    "Directory",
    "Discovery",
    "FileSD",
    "advertise_host",
    "format_target",
    "register",
    "start",
    "target_group",
]

#: Seconds between the monitoring rank's reads of the registrations, until all ranks are in;
#: doubled after each read that finds nothing new, up to :data:`MAX_REFRESH_S`.
REFRESH_S = 1.0
MAX_REFRESH_S = 16.0

# A TEST-NET-1 address (RFC 5737): connecting a UDP socket to it picks the default route's
# interface without sending a packet.
_DEFAULT_ROUTE_PROBE = "192.0.2.1"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _route_ip(host: str) -> str | None:
    """Return the local IP of the interface that routes to ``host`` (no packet is sent)."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError:
        return None


def advertise_host(bind_addr: str, environ: Mapping[str, str] | None = None) -> str:
    """Return the host other machines should scrape this rank at.

    Order: ``DDP_EXPORTER_ADVERTISE_ADDR``; the bind address when it is a specific one; the IP
    of the interface routing to ``MASTER_ADDR``; the hostname's address; the IP of the default
    route's interface; the hostname. Loopback answers are skipped after the bind address, so a
    rank bound to 0.0.0.0 never advertises 127.0.0.1. Raises ValueError for a
    ``DDP_EXPORTER_ADVERTISE_ADDR`` that is not a host (e.g. ``host:port`` or a URL).
    """
    environ = os.environ if environ is None else environ
    explicit = settings.advertise_override(environ)
    if explicit:
        return explicit
    if not settings.is_all_interfaces(bind_addr):
        return bind_addr
    hostname = socket.gethostname()
    candidates = []
    master = environ.get(settings.MASTER_ADDR)
    if master:
        candidates.append(lambda: _route_ip(master))
    candidates.append(lambda: socket.gethostbyname(hostname))
    candidates.append(lambda: _route_ip(_DEFAULT_ROUTE_PROBE))
    for candidate in candidates:
        try:
            ip = candidate()
        except OSError:
            continue
        if ip and not _is_loopback(ip):
            return ip
    return hostname


def format_target(host: str, port: int) -> str:
    """Return ``host:port``, bracketing an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def target_group(target: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """Return one Prometheus SD target group (the http_sd and file_sd format)."""
    return {"targets": [target], "labels": dict(labels)}


def register(store: Any, keys: Keys, target: str, labels: Mapping[str, str]) -> None:
    """Register this rank's target group under ``keys`` (its run's attempt): one store write.

    The record is the target group itself, one JSON line, so the monitoring rank serves it
    as written; ``labels`` must hold the rank (``labels["rank"]``).
    """
    line = json.dumps(target_group(target, labels), separators=(",", ":")) + "\n"
    store.append(keys.sd(), line.encode())


class Directory:
    """The monitoring rank's view of the registrations, served as http_sd JSON from memory."""

    def __init__(
        self,
        store: Any,
        keys: Keys,
        world_size: int,
        errors: ErrorCounter,
        interval_s: float = REFRESH_S,
    ) -> None:
        self._store = store
        self._key = keys.sd()
        self.world_size = world_size
        self._errors = errors
        self._groups: dict[int, str] = {}  # rank -> its target group, serialised
        self._offset = 0  # bytes of the registrations key parsed so far
        self.registered = 0
        self._answer: tuple[bytes, bytes] = (b"[]", gzip.compress(b"[]"))
        self._wait = interval_s
        self._loop = BackgroundLoop(
            "ddp-exporter-discovery", self._tick, interval_s, errors=errors, where="discovery"
        )

    @property
    def complete(self) -> bool:
        """Return True once every rank of the job has registered."""
        return self.registered >= self.world_size

    def start(self) -> None:
        """Read once now, then in the background until the list is complete."""
        # An empty append creates the key without clobbering registrations already in it,
        # so the reads below never block waiting for it.
        self._store.append(self._key, b"")
        try:
            self.refresh()
        except Exception as exc:  # noqa: BLE001 - the thread below tries again
            self._errors.record("discovery", exc)
        if not self.complete:
            self._loop.start()

    def refresh(self) -> bool:
        """Read the registrations with one store read; rebuild the answer if any is new.

        Only the bytes appended since the last read are parsed (the value only grows), so a
        read that finds nothing new costs one store round trip and no parsing. Returns True
        when the answer changed.
        """
        raw = self._store.get(self._key)
        if len(raw) < self._offset:  # the key was recreated: start over
            self._offset, self._groups = 0, {}
        end = raw.rfind(b"\n") + 1
        changed = False
        lines = [x for x in raw[self._offset : end].decode(errors="replace").split("\n") if x]
        for line, group in zip(lines, self._parse(lines)):
            if group is None:
                continue
            try:
                rank = int(group["labels"]["rank"])
                if not all(isinstance(t, str) for t in group["targets"]):
                    raise ValueError(f"bad targets in {line[:200]!r}")
            except (ValueError, KeyError, TypeError) as exc:
                self._errors.record("discovery", exc)  # skip it; the others still count
                continue
            if 0 <= rank < self.world_size:
                # A rank that registered again (a restarted process): its last record wins;
                # the line is served as written.
                self._groups[rank] = line
                changed = True
        self._offset = max(self._offset, end)
        if changed:
            body = ("[" + ",".join(self._groups[r] for r in sorted(self._groups)) + "]").encode()
            self._answer = (body, gzip.compress(body, compresslevel=6))
            self.registered = len(self._groups)
        return changed

    def _parse(self, lines: list[str]) -> list[Any]:
        """Decode JSON lines in one call; line by line (bad ones as None) if any is bad."""
        try:
            out = json.loads("[" + ",".join(lines) + "]")
            if isinstance(out, list) and len(out) == len(lines):
                return out
        except ValueError:
            pass
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError as exc:
                self._errors.record("discovery", exc)
                out.append(None)
        return out

    def _tick(self) -> Any:
        # Back off while nothing new arrives (a rank that died before registering would
        # otherwise cost a read of every registration each second, forever). A dead store
        # raises here: the loop counts it and keeps the current wait.
        if self.refresh():
            self._wait = self._loop.interval_s
        else:
            self._wait = min(self._wait * 2, MAX_REFRESH_S)
        return DONE if self.complete else self._wait

    def answer(self, gzipped: bool = False) -> bytes:
        """Return the current http_sd JSON (gzip-compressed when asked)."""
        body, gz = self._answer
        return gz if gzipped else body

    def close(self) -> None:
        """Stop the refresh thread."""
        self._loop.close()


def _not_served(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """Answer ``/sd`` with 404 where it is not served (not the monitoring rank, or an error)."""
    body = (
        b"/sd is served by the monitoring rank only (DDP_EXPORTER_MONITOR_RANK); "
        b'see ddp_exporter_errors_total{where="discovery"} if this is it\n'
    )
    start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
    return [body]


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class FileSD:
    """This rank's file_sd target file in a directory Prometheus watches."""

    def __init__(self, directory: str, run: str, rank: int) -> None:
        self.directory = directory
        name = f"{_UNSAFE.sub('_', run)}-rank-{rank}"
        self.path = os.path.join(directory, f"ddp-{name}.json")
        # A leading dot and a .tmp suffix keep the half-written file out of *.json globs.
        self._tmp = os.path.join(directory, f".ddp-{name}.json.tmp")

    def write(self, target: str, labels: Mapping[str, str]) -> None:
        """Write the file atomically (temporary file, then rename)."""
        os.makedirs(self.directory, exist_ok=True)
        with open(self._tmp, "w") as f:
            json.dump([target_group(target, labels)], f)
        os.replace(self._tmp, self.path)

    def remove(self) -> None:
        """Remove the file (a clean exit: the rank is gone, not down)."""
        for path in (self.path, self._tmp):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


class Discovery:
    """Register one rank for discovery and, on the monitoring rank, serve ``/sd``."""

    def __init__(
        self,
        *,
        store: Any | None,
        keys: Keys,
        run: str,
        rank: int,
        local_rank: int,
        world_size: int,
        host: str,
        port: int,
        monitor: bool,
        errors: ErrorCounter,
        file_sd_dir: str | None = None,
        node: str | None = None,
        scheme: str = "http",
    ) -> None:
        self.target = format_target(host, port)
        self.labels = {
            "run": run,
            "rank": str(rank),
            "local_rank": str(local_rank),
            "node": node if node is not None else socket.gethostname(),
        }
        if scheme != "http":
            # Prometheus's own meta label: the target is scraped over TLS whatever the scrape
            # config's default scheme says (its tls_config still names the CA).
            self.labels["__scheme__"] = scheme
        self._errors = errors
        self.directory: Directory | None = None
        self.file_sd: FileSD | None = None
        if file_sd_dir:
            try:
                self.file_sd = FileSD(file_sd_dir, run, rank)
                self.file_sd.write(self.target, self.labels)
            except Exception as exc:  # noqa: BLE001
                errors.record("discovery", exc)
                self.file_sd = None
        if store is None:
            return
        try:
            register(store, keys, self.target, self.labels)
        except Exception as exc:  # noqa: BLE001
            errors.record("discovery", exc)
        if monitor:
            try:
                self.directory = Directory(store, keys, world_size, errors)
                self.directory.start()
            except Exception as exc:  # noqa: BLE001
                errors.record("discovery", exc)

    def sd_app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        """Answer ``GET /sd`` (a WSGI app): the http_sd JSON, or 404 off the monitoring rank."""
        if self.directory is None:
            return _not_served(environ, start_response)
        gzipped = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        body = self.directory.answer(gzipped)
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    def close(self) -> None:
        """Stop refreshing and remove this rank's file_sd file."""
        if self.directory is not None:
            self.directory.close()
        if self.file_sd is not None:
            try:
                self.file_sd.remove()
            except Exception as exc:  # noqa: BLE001
                self._errors.record("discovery", exc)


def start(
    identity: settings.Identity,
    server: Any,
    *,
    monitor: bool,
    errors: ErrorCounter,
    store: Any | None,
    file_sd_dir: str | None = None,
) -> Discovery | None:
    """Set up discovery for a rank whose ``server`` (a serving MetricsServer) is up.

    Registers the rank in ``store`` (the default c10d store; None without a process group),
    writes its file_sd file into ``file_sd_dir`` when one is given (``DDP_EXPORTER_FILE_SD``),
    and mounts ``/sd`` on ``server``. Errors are counted, never raised.
    """
    if server is None or server.port is None:
        return None
    try:
        found = Discovery(
            store=store,
            keys=storekeys.for_run(identity.run, identity.attempt),
            run=identity.run,
            rank=identity.rank,
            local_rank=identity.local_rank,
            world_size=identity.world_size,
            host=advertise_host(server.addr),
            port=server.port,
            monitor=monitor,
            errors=errors,
            file_sd_dir=file_sd_dir,
            node=identity.node or None,
            scheme=getattr(server, "scheme", "http"),
        )
        server.route("/sd", found.sd_app)
        return found
    except Exception as exc:  # noqa: BLE001
        errors.record("discovery", exc)
        server.route("/sd", _not_served)
        return None
