"""The doctor's checks that one rank makes alone, and what a rank publishes: Check, Report."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ... import settings
from ...network import netcheck, reach
from ...ranklist import format_ranks

__all__ = [
    "ABANDONED",
    "CHECKS",
    "Check",
    "Checks",
    "DEFAULT_STEP_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "Deadline",
    "FAIL",
    "FIX_GLOO",
    "FIX_LAUNCHER",
    "FIX_SHARED",
    "FIX_VERSIONS",
    "MISSING",
    "NA",
    "OK",
    "POLL_S",
    "REACH_ALL_MAX_RANKS",
    "REACH_NEIGHBOURS",
    "REACH_S",
    "REQUIRED_ENV",
    "Report",
    "SKIP",
    "VERDICT_GRACE_S",
    "VERSION_KEYS",
    "WARN",
    "bounded",
    "check_env",
    "check_ifnames",
    "check_master_is_here",
    "check_restart",
    "made_and_failed",
    "local_versions",
    "probe_port",
    "ranks_text",
    "resolve_master",
    "round_trip",
]

#: The versions compared across ranks (and the keys the test-only override accepts).
VERSION_KEYS = settings.VERSION_KEYS
REQUIRED_ENV = (
    settings.MASTER_ADDR,
    settings.MASTER_PORT,
    settings.RANK,
    settings.WORLD_SIZE,
    settings.LOCAL_RANK,
)
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_STEP_TIMEOUT_S = 10.0
#: Rank 0 keeps its store up this long after the verdict so the other ranks can read it.
VERDICT_GRACE_S = 3.0
#: Seconds each rank tries to connect to each other rank's gloo address (in parallel).
REACH_S = 3.0
#: Largest job in which every rank tries every other; beyond, each its ring neighbours.
REACH_ALL_MAX_RANKS = reach.REACH_ALL_MAX
REACH_NEIGHBOURS = reach.REACH_NEIGHBOURS
POLL_S = 0.1

OK, FAIL, SKIP, NA, MISSING, WARN = "ok", "FAIL", "skip", "-", "missing", "warn"

FIX_LAUNCHER = (
    "run doctor under the job's launcher with the job's environment "
    "(torchrun ... -m exporter.doctor, or srun/mpirun python -m exporter.doctor)"
)
FIX_GLOO = (
    "every rank must reach every other rank on any port, not only MASTER_PORT; set "
    "GLOO_SOCKET_IFNAME to the interface of the network the nodes share"
)
FIX_VERSIONS = "install the same Python, torch, CUDA and NCCL on every node (one image or wheel)"
FIX_SHARED = (
    "launch with --rdzv-backend c10d --rdzv-endpoint HOST:PORT and "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (static --master-addr/--master-port rendezvous always "
    "shares the store)"
)


@dataclass
class Check:
    """One check's outcome on one rank: status, what was seen, and how to fix a failure."""

    status: str
    detail: str = ""
    fix: str = ""

    @property
    def failed(self) -> bool:
        """Return whether this check failed (a missing rank counts as failed)."""
        return self.status in (FAIL, MISSING)


@dataclass
class Checks:
    """One rank's checks, one per column of the table, in its order (None: not made)."""

    env: Check | None = None
    addr: Check | None = None
    port: Check | None = None
    ifname: Check | None = None
    store: Check | None = None
    reach: Check | None = None
    gloo: Check | None = None
    versions: Check | None = None
    restart: Check | None = None
    #: Only with ``--links``.
    links: Check | None = None

    @classmethod
    def skipped(cls, columns: tuple[str, ...]) -> Checks:
        """Return every check of ``columns`` skipped (what a rank that stops early shows)."""
        return cls(**{name: Check(SKIP) for name in columns})

    def get(self, name: str) -> Check | None:
        """Return the check of column ``name``, None where it was not made."""
        found: Check | None = getattr(self, name)
        return found

    def made(self) -> list[tuple[str, Check]]:
        """Return ``(column, check)`` of every check made, in column order."""
        return [(f.name, c) for f in fields(self) if (c := getattr(self, f.name)) is not None]


def made_and_failed(check: Check | None) -> bool:
    """Say whether ``check`` was made and failed."""
    return check is not None and check.failed


#: The columns of the table, in order (``links`` is added with ``--links``).
CHECKS = tuple(f.name for f in fields(Checks) if f.name != "links")


@dataclass
class Report:
    """What one rank publishes: who it is, its versions, and its checks."""

    rank: int | None
    world_size: int | None
    local_rank: int | None
    host: str
    pid: int
    versions: dict[str, str]
    checks: Checks = field(default_factory=Checks)
    #: ``ip:port`` this rank listens on at the address gloo would advertise, and what chose it.
    reach: str = ""
    reach_why: str = ""

    def to_json(self) -> str:
        """Serialise for the store."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Report:
        """Parse what :meth:`to_json` wrote."""
        raw = json.loads(text)
        made = {k: Check(**v) for k, v in raw["checks"].items() if v is not None}
        raw["checks"] = Checks(**made)
        return cls(**raw)

    def failures(self) -> list[tuple[str, Check]]:
        """Return the failed checks, in column order."""
        return [(name, check) for name, check in self.checks.made() if check.failed]


class Deadline:
    """The overall deadline; every step gets its own, never past this one."""

    def __init__(self, seconds: float, step_s: float) -> None:
        self.start = time.monotonic()
        self.end = self.start + seconds
        self.step_s = step_s

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def step(self, cap: float | None = None) -> float:
        """Return the seconds the next step may take: its own limit, within the overall one."""
        return max(0.1, min(self.step_s if cap is None else cap, self.left()))

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def bounded(fn: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    """Run ``fn`` in a daemon thread; return ``(finished, result or exception)`` by the deadline.

    A step that may block in C++ (DNS, a store connect, gloo) runs here so that the doctor can
    walk away from it; the process then ends with ``os._exit`` (see :func:`main`).
    """
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - reported as the step's failure
            box.append((False, exc))

    t = threading.Thread(target=run, name="ddp-exporter-doctor-step", daemon=True)
    t.start()
    t.join(seconds)
    if not box:
        ABANDONED.append(t)
        return False, TimeoutError(f"no answer within {seconds:.0f} s")
    ok, value = box[0]
    return ok, value


ABANDONED: list[threading.Thread] = []


def check_env(environ: Mapping[str, str]) -> Check:
    """Check that the launcher's variables are present and make sense on this rank."""
    missing = [n for n in REQUIRED_ENV if not environ.get(n)]
    if missing:
        return Check(FAIL, f"not set: {', '.join(missing)}", FIX_LAUNCHER)
    bad = [
        f"{n}={environ[n]!r}"
        for n in (settings.MASTER_PORT, settings.RANK, settings.WORLD_SIZE, settings.LOCAL_RANK)
        if settings.int_or_none(environ, n) is None
    ]
    if bad:
        return Check(FAIL, f"not an integer: {', '.join(bad)}", FIX_LAUNCHER)
    rank, world = (
        settings.int_or_none(environ, settings.RANK),
        settings.int_or_none(environ, settings.WORLD_SIZE),
    )
    port, local = (
        settings.int_or_none(environ, settings.MASTER_PORT),
        settings.int_or_none(environ, settings.LOCAL_RANK),
    )
    assert rank is not None and world is not None and port is not None and local is not None
    if world < 1 or not 0 <= rank < world:
        return Check(FAIL, f"RANK={rank} is not in 0..WORLD_SIZE-1 ({world})", FIX_LAUNCHER)
    if not 0 < port < 65536:
        return Check(FAIL, f"MASTER_PORT={port} is not a TCP port", "use a port in 1..65535")
    lws = settings.int_or_none(environ, settings.LOCAL_WORLD_SIZE)
    if local < 0 or (lws is not None and local >= lws):
        return Check(FAIL, f"LOCAL_RANK={local} with LOCAL_WORLD_SIZE={lws}", FIX_LAUNCHER)
    return Check(OK)


def _interfaces() -> list[str]:
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


def check_ifnames(environ: Mapping[str, str], interfaces: list[str] | None = None) -> Check:
    """Check that GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME name interfaces of this host.

    Gloo takes a comma-separated list of exact names. NCCL takes prefixes, ``=name`` for exact
    names and ``^...`` to exclude; an exclusion list is not checked.
    """
    have = _interfaces() if interfaces is None else interfaces
    problems, set_any = [], False
    for var in (settings.GLOO_SOCKET_IFNAME, settings.NCCL_SOCKET_IFNAME):
        value = environ.get(var, "")
        if not value:
            continue
        set_any = True
        if var.startswith("NCCL") and value.startswith("^"):
            continue
        exact = var.startswith("GLOO") or value.startswith("=")
        wanted = [w for w in value.lstrip("=").split(",") if w]
        if exact:
            absent = [w for w in wanted if w not in have]
        else:
            absent = [w for w in wanted if not any(h.startswith(w) for h in have)]
        # NCCL uses the first prefix that matches; Gloo needs every listed name.
        if absent and (exact or len(absent) == len(wanted)):
            problems.append(f"{var}={value}: no interface {', '.join(absent)}")
    if problems:
        return Check(
            FAIL,
            "; ".join(problems),
            f"set it to an interface that exists on every node (here: {', '.join(have)}), "
            "or unset it",
        )
    return Check(OK if set_any else NA)


def check_restart(environ: Mapping[str, str], store: Any, torch_version: str) -> Check:
    """Check that torchrun's restarts of this job can connect again (``store``: the job's).

    torchrun keeps its agent's store for every attempt unless each attempt gets its own; a
    restart then reads the previous attempt's process-group keys. The hang action clears them
    when it ends an attempt, where the store can list its keys; other failures leave them.
    """
    from ...sources import launcher

    form = launcher.launch(environ)
    if not form.torchrun or not form.restarts_left:
        return Check(NA)
    if not form.shared_store:
        return Check(OK, "every attempt gets a store of its own")
    abort = settings.on_hang("doctor", environ=environ).action == "abort"
    blocker = launcher.restart_blocker(form, store, torch_version)
    if abort:
        if blocker is None:
            return Check(OK, "shared store; the hang action clears an aborted attempt's keys")
        return Check(FAIL, blocker.split("; ")[0], blocker.split("; ", 1)[1])
    return Check(
        WARN,
        f"torchrun may restart this job ({form.restarts_left} restarts left) under its agent's "
        "store, shared by every attempt: with torch 2.13 a restart after a crash reads the "
        "previous attempt's keys and cannot connect (pytorch/pytorch#167288)",
        FIX_SHARED,
    )


def local_versions(environ: Mapping[str, str]) -> dict[str, str]:
    """Return this rank's Python/torch/CUDA/NCCL versions (``none`` where not built in).

    ``DDP_EXPORTER_DOCTOR_FAKE_VERSIONS`` (tests only) overrides some, e.g. ``torch=9.9.9``.
    """
    from ...sources.versions import versions

    found = versions()
    own = {key: found[f"{key}_version"] for key in VERSION_KEYS}
    return {**own, **settings.fake_versions(environ)}


def resolve_master(addr: str, seconds: float) -> tuple[Check, str | None]:
    finished, value = bounded(
        lambda: socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM), seconds
    )
    if not finished:
        return Check(
            FAIL,
            f"MASTER_ADDR={addr} does not resolve ({value})",
            "fix this node's DNS or /etc/hosts, or set MASTER_ADDR to rank 0's IP address",
        ), None
    ip = value[0][4][0]
    return Check(OK, f"{addr} -> {ip}"), ip


def check_master_is_here(addr: str, ip: str) -> Check:
    """On rank 0 hosting the store: MASTER_ADDR must be one of this host's addresses."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return Check(
                    FAIL,
                    f"MASTER_ADDR={addr} ({ip}) is not an address of rank 0's host "
                    f"{socket.gethostname()}",
                    "set MASTER_ADDR to rank 0's node (its host name or IP as the others see it)",
                )
            raise
    return Check(OK, f"{addr} -> {ip} (this host)")


def probe_port(addr: str, port: int, seconds: float) -> Check:
    """Connect to MASTER_ADDR:MASTER_PORT, retrying until ``seconds`` (rank 0 may start late)."""
    found = netcheck.probe_tcp(addr, port, seconds)
    if found.ok:
        return Check(OK, f"{found.where()} took a connection in {found.seconds:.1f} s")
    detail, fix = netcheck.explain_master(found, socket.gethostname())
    return Check(FAIL, detail, fix)


def round_trip(store: Any, key: str) -> Check:
    token = f"{os.getpid()}-{time.time_ns()}"
    t = time.perf_counter()
    store.set(key, token)
    back = store.get(key).decode()
    ms = (time.perf_counter() - t) * 1e3
    if back != token:
        return Check(FAIL, f"wrote {token!r}, read {back!r}", "another job shares this store")
    return Check(OK, f"set+get {ms:.1f} ms")


def ranks_text(ranks: Sequence[int | None]) -> str:
    return format_ranks(ranks, noun=True)
