"""Check, before a job starts, that its ranks can meet: ``ddp-exporter doctor``.

Run it under the job's own launcher, with the job's environment, so it sees what the job sees::

    torchrun --nnodes 2 --nproc-per-node 8 ... -m exporter.doctor       # or: ddp-exporter doctor
    srun python -m exporter.doctor                                      # one process per rank

Every rank checks what it can alone (required env, ``MASTER_ADDR`` resolves, ``MASTER_PORT``
accepts a TCP connection, ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` name interfaces that
exist, a c10d-store round trip, whether torchrun's restarts can connect again: ``restart``,
a warning where a shared store makes a restart after a crash fail, a failure where
``DDP_EXPORTER_ON_HANG=abort`` could not clear it) and publishes the results and its Python/torch/CUDA/NCCL
versions through the c10d store at ``MASTER_ADDR:MASTER_PORT``. Facts travel through the store,
not through collectives, so a rank that never arrives is reported as *missing* instead of
hanging everyone. When every rank arrived, all run one tiny gloo ``all_reduce``. Rank 0 then
checks the ranks against each other (unique ranks, one world size, identical versions) and
prints one table, a row per rank, with the fix for each failure. Other ranks print only their
own failures (a rank that cannot reach the store can tell nobody else).

Every step has its own deadline (``--step-timeout``) inside the overall one (``--timeout``), so
doctor always ends: exit status 0 when everything passed on every rank, 1 otherwise, 2 for bad
usage. Under torchrun the agent already hosts the store on ``MASTER_PORT`` and every rank is a
client; with one process per rank (srun, mpirun) rank 0 hosts it, like ``init_process_group``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import errno
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import settings, storekeys
from ..ranklist import format_ranks
from ..sources import netcheck
from . import links

__all__ = [
    "CHECKS",
    "VERSION_KEYS",
    "Check",
    "Report",
    "add_parser",
    "build_parser",
    "check_env",
    "check_ifnames",
    "check_restart",
    "compare",
    "judge_reach",
    "local_versions",
    "main",
    "reach_targets",
    "render",
    "run",
]

#: The columns of the table, in order.
CHECKS = ("env", "addr", "port", "ifname", "store", "reach", "gloo", "versions", "restart")
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
REACH_ALL_MAX_RANKS = 64
REACH_NEIGHBOURS = 4
_POLL_S = 0.1

OK, FAIL, SKIP, NA, MISSING, WARN = "ok", "FAIL", "skip", "-", "missing", "warn"

_FIX_LAUNCHER = (
    "run doctor under the job's launcher with the job's environment "
    "(torchrun ... -m exporter.doctor, or srun/mpirun python -m exporter.doctor)"
)
_FIX_GLOO = (
    "every rank must reach every other rank on any port, not only MASTER_PORT; set "
    "GLOO_SOCKET_IFNAME to the interface of the network the nodes share"
)
_FIX_VERSIONS = "install the same Python, torch, CUDA and NCCL on every node (one image or wheel)"
_FIX_SHARED = (
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
class Report:
    """What one rank publishes: who it is, its versions, and its checks."""

    rank: int | None
    world_size: int | None
    local_rank: int | None
    host: str
    pid: int
    versions: dict[str, str]
    checks: dict[str, Check] = field(default_factory=dict)
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
        raw["checks"] = {k: Check(**v) for k, v in raw["checks"].items()}
        return cls(**raw)

    def failures(self) -> list[tuple[str, Check]]:
        """Return the failed checks, in column order."""
        order = [*CHECKS, *(n for n in self.checks if n not in CHECKS)]
        return [(n, self.checks[n]) for n in order if n in self.checks and self.checks[n].failed]


class _Deadline:
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


def _bounded(fn: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
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
        _abandoned.append(t)
        return False, TimeoutError(f"no answer within {seconds:.0f} s")
    ok, value = box[0]
    return ok, value


_abandoned: list[threading.Thread] = []


def check_env(environ: Mapping[str, str]) -> Check:
    """Check that the launcher's variables are present and make sense on this rank."""
    missing = [n for n in REQUIRED_ENV if not environ.get(n)]
    if missing:
        return Check(FAIL, f"not set: {', '.join(missing)}", _FIX_LAUNCHER)
    bad = [
        f"{n}={environ[n]!r}"
        for n in (settings.MASTER_PORT, settings.RANK, settings.WORLD_SIZE, settings.LOCAL_RANK)
        if settings.int_or_none(environ, n) is None
    ]
    if bad:
        return Check(FAIL, f"not an integer: {', '.join(bad)}", _FIX_LAUNCHER)
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
        return Check(FAIL, f"RANK={rank} is not in 0..WORLD_SIZE-1 ({world})", _FIX_LAUNCHER)
    if not 0 < port < 65536:
        return Check(FAIL, f"MASTER_PORT={port} is not a TCP port", "use a port in 1..65535")
    lws = settings.int_or_none(environ, settings.LOCAL_WORLD_SIZE)
    if local < 0 or (lws is not None and local >= lws):
        return Check(FAIL, f"LOCAL_RANK={local} with LOCAL_WORLD_SIZE={lws}", _FIX_LAUNCHER)
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
    from ..sources import launcher

    form = launcher.launch(environ)
    if not form.torchrun or not form.restarts_left:
        return Check(NA)
    if not form.shared_store:
        return Check(OK, "every attempt gets a store of its own")
    abort = environ.get(settings.ON_HANG, "").strip().lower() == "abort"
    blocker = launcher.restart_blocker(form, store, torch_version)
    if abort and blocker is None:
        return Check(OK, "shared store; the hang action clears an aborted attempt's keys")
    if abort:
        return Check(FAIL, blocker.split("; ")[0], blocker.split("; ", 1)[1])
    return Check(
        WARN,
        f"torchrun may restart this job ({form.restarts_left} restarts left) under its agent's "
        "store, shared by every attempt: with torch 2.13 a restart after a crash reads the "
        "previous attempt's keys and cannot connect (pytorch/pytorch#167288)",
        _FIX_SHARED,
    )


def local_versions(environ: Mapping[str, str]) -> dict[str, str]:
    """Return this rank's Python/torch/CUDA/NCCL versions (``none`` where not built in).

    ``DDP_EXPORTER_DOCTOR_FAKE_VERSIONS`` (tests only) overrides some, e.g. ``torch=9.9.9``.
    """
    from ..sources.versions import versions

    found = versions()
    own = {key: found[f"{key}_version"] for key in VERSION_KEYS}
    return {**own, **settings.fake_versions(environ)}


def _resolve(addr: str, seconds: float) -> tuple[Check, str | None]:
    finished, value = _bounded(
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


def _check_master_is_here(addr: str, ip: str) -> Check:
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


def _probe_port(addr: str, port: int, seconds: float) -> Check:
    """Connect to MASTER_ADDR:MASTER_PORT, retrying until ``seconds`` (rank 0 may start late)."""
    found = netcheck.probe_tcp(addr, port, seconds)
    if found.ok:
        return Check(OK)
    detail, fix = netcheck.explain_master(found, socket.gethostname())
    return Check(FAIL, detail, fix)


def _round_trip(store: Any, key: str) -> Check:
    token = f"{os.getpid()}-{time.time_ns()}"
    t = time.perf_counter()
    store.set(key, token)
    back = store.get(key).decode()
    ms = (time.perf_counter() - t) * 1e3
    if back != token:
        return Check(FAIL, f"wrote {token!r}, read {back!r}", "another job shares this store")
    return Check(OK, f"set+get {ms:.1f} ms")


def compare(reports: list[Report], world_size: int) -> tuple[list[Report | int], list[str]]:
    """Check the ranks against each other; return table rows (an int: a missing rank) and notes.

    Adds failures to the reports in place: duplicate ranks, another world size, version skew
    (the odd ranks are those that differ from the most common value, rank 0's on a tie).
    """
    notes: list[str] = []
    by_rank: dict[int, list[Report]] = collections.defaultdict(list)
    for rep in reports:
        if rep.rank is not None:
            by_rank[rep.rank].append(rep)
    for rank, reps in by_rank.items():
        if len(reps) > 1:
            who = ", ".join(f"{r.host} pid {r.pid}" for r in reps)
            for rep in reps:
                rep.checks["env"] = Check(
                    FAIL, f"RANK={rank} claimed by {len(reps)} processes ({who})", _FIX_LAUNCHER
                )
    for rep in reports:
        if rep.world_size != world_size:
            rep.checks["env"] = Check(
                FAIL, f"WORLD_SIZE={rep.world_size} here, {world_size} on rank 0", _FIX_LAUNCHER
            )
    locals_ = collections.defaultdict(list)
    for rep in reports:
        locals_[(rep.host, rep.local_rank)].append(rep)
    for (host, local), reps in locals_.items():
        if len(reps) > 1 and all(not r.checks["env"].failed for r in reps):
            for rep in reps:
                rep.checks["env"] = Check(
                    FAIL,
                    f"LOCAL_RANK={local} shared by ranks "
                    f"{_ranks([r.rank for r in reps])} on {host}",
                    _FIX_LAUNCHER,
                )
    for key in VERSION_KEYS:
        seen = collections.Counter(rep.versions.get(key, "?") for rep in reports)
        if len(seen) < 2:
            continue
        rank0 = next((r.versions.get(key) for r in reports if r.rank == 0), None)
        top = max(seen.values())
        common = rank0 if seen.get(rank0) == top else seen.most_common(1)[0][0]
        groups: dict[str, list[int | None]] = collections.defaultdict(list)
        for rep in reports:
            groups[rep.versions.get(key, "?")].append(rep.rank)
        odd = "; ".join(
            f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'} {v}"
            for v, rs in sorted(groups.items())
            if v != common
        )
        rest = groups[common]
        note = (
            f"{key} differs: {odd}, {_ranks(rest)} {'has' if len(rest) == 1 else 'have'} {common}"
        )
        notes.append(f"version skew: {note}")
        for rep in reports:
            if rep.versions.get(key, "?") != common:
                detail = f"{key} {rep.versions.get(key, '?')}, not {common} like {_ranks(rest)}"
                old = rep.checks["versions"]
                if old.failed:
                    detail = f"{old.detail}; {detail}"
                rep.checks["versions"] = Check(FAIL, detail, _FIX_VERSIONS)
    rows: list[Report | int] = []
    for rank in range(world_size):
        rows.extend(by_rank.get(rank) or [rank])
    rows.extend(r for r in reports if r.rank is None or not 0 <= r.rank < world_size)
    return rows, notes


def _ranks(ranks: list[int | None]) -> str:
    return format_ranks(ranks, noun=True)


def render(
    rows: list[Report | int],
    notes: list[str],
    missing_fix: str,
    columns: tuple[str, ...] = CHECKS,
) -> str:
    """Return the table, one row per rank, then every failure and warning with its fix."""
    header = ["rank", "host", *columns]
    table = [header]
    problems: list[str] = []
    warned: dict[tuple[str, str, str], list[int | None]] = {}
    for row in rows:
        if isinstance(row, int):
            table.append([str(row), "?", MISSING] + [""] * (len(columns) - 1))
            problems.append(f"rank {row} missing: {missing_fix}")
            continue
        cells = [str(row.rank), row.host]
        cells += [row.checks.get(n, Check(NA)).status for n in columns]
        table.append(cells)
        for name, check in row.failures():
            problems.append(f"rank {row.rank} {name}: {check.detail}. Fix: {check.fix}")
        for name in columns:
            check = row.checks.get(name)
            if check is not None and check.status == WARN:
                warned.setdefault((name, check.detail, check.fix), []).append(row.rank)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    present = [r for r in rows if isinstance(r, Report)]
    if present and not any(n.startswith("version skew") for n in notes):
        v = present[0].versions
        every = "every rank" if len(present) == len(rows) else "every rank that reported"
        notes = [", ".join(f"{k} {v.get(k)}" for k in VERSION_KEYS) + f" on {every}", *notes]
    lines += notes
    lines += [f"FAIL {p}" for p in problems]
    lines += [
        f"WARN {_ranks(ranks)} {name}: {detail}. Fix: {fix}"
        for (name, detail, fix), ranks in warned.items()
    ]
    return "\n".join(lines)


def _own_failures(rep: Report) -> str:
    return "\n".join(
        f"ddp-exporter doctor rank {'?' if rep.rank is None else rep.rank}: "
        f"FAIL {name}: {c.detail}. Fix: {c.fix}"
        for name, c in rep.failures()
    )


_DESCRIPTION = (
    "Check, before a job starts, that its ranks can meet: run it under the job's launcher "
    "(torchrun ... -m exporter.doctor, srun python -m exporter.doctor). Rank 0 prints the "
    "verdict; exit 0 when every check passed on every rank, 1 when one failed."
)


def build_parser(prog: str = "ddp-exporter doctor") -> argparse.ArgumentParser:
    """Build the doctor's argument parser (``python -m exporter.doctor``)."""
    return _arguments(argparse.ArgumentParser(prog=prog, description=_DESCRIPTION))


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``doctor`` to the ``ddp-exporter`` subcommands."""
    p = sub.add_parser(
        "doctor", help="preflight: check that the ranks of a job can meet", description=_DESCRIPTION
    )
    return _arguments(p)


def _arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.set_defaults(tool=run, parser=p)
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="overall seconds; rank 0 prints the table by then (default %(default)s)",
    )
    p.add_argument(
        "--step-timeout",
        type=float,
        default=DEFAULT_STEP_TIMEOUT_S,
        help="seconds for each network step: port, store, collective (default %(default)s)",
    )
    p.add_argument(
        "--links",
        action="store_true",
        help="also measure every pair of nodes over gloo and name a node whose link is slow "
        "(give --timeout room: a few seconds per round on a slow link)",
    )
    p.add_argument(
        "--links-mib",
        type=float,
        default=links.DEFAULT_MIB,
        help="MiB each way per pair of nodes with --links (default %(default)s)",
    )
    return p


def reach_targets(rank: int, world: int) -> list[int]:
    """Return the ranks ``rank`` tries to connect to: every other, or its ring neighbours."""
    if world <= REACH_ALL_MAX_RANKS:
        return [r for r in range(world) if r != rank]
    near = {(rank + d) % world for d in range(-REACH_NEIGHBOURS, REACH_NEIGHBOURS + 1)}
    return sorted(near - {rank})


def judge_reach(
    reports: list[Report], failed: dict[int, dict[int, str]], world: int
) -> tuple[dict[int, Check], list[str]]:
    """Name the ranks the others cannot reach on their gloo address; return checks and notes.

    ``failed`` maps each rank that tried to ``{peer: how it failed}``. A rank is to blame when
    more than half of the ranks that tried it failed: a firewall that drops gloo's ports on
    its node, or a GLOO_SOCKET_IFNAME the other nodes have no route to. The worst-reached
    rank is blamed first and its own attempts then no longer count (a node that drops
    everything fails towards everyone), so a rank whose attempts failed only towards ranks to
    blame is fine.
    """
    by_rank = {r.rank: r for r in reports if r.rank is not None}

    def failed_against(triers: set[int]) -> dict[int, dict[int, str]]:
        """Return ``{peer: {rank that failed to reach it: how}}`` over ``triers``' attempts."""
        out: dict[int, dict[int, str]] = collections.defaultdict(dict)
        for rank in triers:
            for peer, kind in failed[rank].items():
                out[int(peer)][rank] = kind
        return out

    blamed: set[int] = set()
    while True:
        triers = set(failed) - blamed
        tried = collections.Counter(p for rank in triers for p in reach_targets(rank, world))
        against = failed_against(triers)
        worst = max(
            (p for p, who in against.items() if p not in blamed and len(who) * 2 > tried[p]),
            key=lambda p: (len(against[p]) / tried[p], -p),
            default=None,
        )
        if worst is None:
            break
        blamed.add(worst)
    against = failed_against(set(failed))  # every rank that tried, for the detail
    checks: dict[int, Check] = {}
    notes: list[str] = []
    for rank in sorted(by_rank):
        rep = by_rank[rank]
        if rank not in failed:
            checks[rank] = Check(FAIL, "no result within the deadline", _FIX_GLOO)
        elif rank in blamed:
            who, kinds = against[rank], sorted(set(against[rank].values()))
            detail = (
                f"its gloo address {rep.reach} ({rep.reach_why}) on {rep.host} is not reachable "
                f"from {_ranks(sorted(who))} ({', '.join(kinds)})"
            )
            if netcheck.is_loopback(rep.reach.rpartition(":")[0]):
                fix = (
                    f"gloo on {rep.host} advertises a loopback address ({rep.reach_why}): map "
                    f"the hostname to {rep.host}'s network address (/etc/hosts) or set "
                    "GLOO_SOCKET_IFNAME to the interface the nodes share"
                )
            elif rep.reach_why.startswith("GLOO_SOCKET_IFNAME"):
                fix = (
                    f"set GLOO_SOCKET_IFNAME on {rep.host} to the interface the nodes share "
                    "(the one routing to MASTER_ADDR), or unset it"
                )
            else:
                fix = (
                    f"{rep.host} drops connections on ports other than MASTER_PORT: gloo connects "
                    "on ephemeral ports, so open TCP between the nodes on every port (its "
                    "firewall, a security group)"
                )
            checks[rank] = Check(FAIL, detail, fix)
        elif set(failed[rank]) - blamed:
            lost = sorted(set(failed[rank]) - blamed)
            checks[rank] = Check(
                FAIL, f"cannot reach {_ranks(lost)} on their gloo addresses", _FIX_GLOO
            )
        else:
            checks[rank] = Check(OK)
    if blamed:
        names = ", ".join(f"rank {r} on {by_rank[r].host}" for r in sorted(blamed) if r in by_rank)
        notes.append(f"reach: the other ranks cannot connect to {names}")
    return checks, notes


class _Doctor:
    """One rank's run: local checks, publish through the store, then compare on rank 0."""

    def __init__(
        self, environ: Mapping[str, str], timeout: float, step: float, links_mib: float = 0.0
    ) -> None:
        self.env = environ
        #: MiB each way per pair of nodes for the links check; 0: not asked for.
        self.links_mib = links_mib
        self.columns = CHECKS + (("links",) if links_mib > 0 else ())
        self.dl = _Deadline(timeout, step)
        self.timeout = timeout
        self.rank = settings.int_or_none(environ, settings.RANK)
        self.world = settings.int_or_none(environ, settings.WORLD_SIZE)
        self.prefix = storekeys.doctor_prefix(settings.restart_count(environ))
        # Under torchrun the agent hosts the store on MASTER_PORT; else rank 0 does.
        self.agent_store = environ.get(settings.TORCHELASTIC_USE_AGENT_STORE) == "True"
        self.store: Any = None
        self.report = Report(
            rank=self.rank,
            world_size=self.world,
            local_rank=settings.int_or_none(environ, settings.LOCAL_RANK),
            host=socket.gethostname(),
            pid=os.getpid(),
            versions=local_versions(environ),
        )
        for name in self.columns:
            self.report.checks[name] = Check(SKIP)
        self.report.checks["versions"] = Check(OK)

    def run(self) -> int:
        checks = self.report.checks
        checks["env"] = check_env(self.env)
        checks["ifname"] = check_ifnames(self.env)
        if checks["env"].failed and (
            self.rank is None
            or self.world is None
            or settings.int_or_none(self.env, settings.MASTER_PORT) is None
        ):
            return self._alone()
        self._connect()
        if self.store is None:
            return self._alone()
        self._listen()
        try:
            # The counter gives each process its own key: duplicate RANKs do not overwrite.
            n = self.store.add(self.prefix + "arrived", 1)
            self._publish(f"report/{n}", self.report.to_json())
        except Exception as exc:  # noqa: BLE001 - the store host left after the round trip
            checks["store"] = Check(FAIL, f"publishing failed: {exc}", "rank 0 left early")
            return self._alone()
        return self._rank0() if self.rank == 0 else self._peer()

    # -- steps -----------------------------------------------------------------------------
    def _listen(self) -> None:
        """Listen where gloo would, so that every other rank can try to connect there."""
        addr, why = netcheck.gloo_address(self.env)
        self.report.reach_why = why
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
            sock.bind((addr, 0))
            sock.listen(64)
        except OSError as exc:
            self.report.checks["reach"] = Check(
                FAIL, f"cannot listen on {addr} ({why}): {exc}", _FIX_GLOO
            )
            return
        self.report.reach = f"{addr}:{sock.getsockname()[1]}"

        def accept() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                    conn.close()
                except OSError:
                    return

        threading.Thread(target=accept, name="ddp-exporter-doctor-reach", daemon=True).start()

    def _reach(self) -> None:
        """Try every target rank's gloo address at once; publish how each attempt ended."""
        from concurrent.futures import ThreadPoolExecutor

        assert self.world is not None and self.rank is not None
        peers = json.loads(self._wait_key("peers", self.dl.end) or "{}")

        def attempt(peer: int) -> tuple[int, str]:
            where = peers.get(str(peer), "")
            if not where:
                return peer, "unresolved"
            host, _, port = where.rpartition(":")
            return peer, netcheck.probe_tcp(host, int(port), REACH_S).kind

        targets = reach_targets(self.rank, self.world)
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
            results = dict(pool.map(attempt, targets))
        failed = {str(p): k for p, k in results.items() if k != "ok"}
        self._publish(f"reach/{self.rank}", json.dumps(failed))

    def _connect(self) -> None:
        from torch.distributed import TCPStore

        checks = self.report.checks
        addr, port = self.env[settings.MASTER_ADDR], int(self.env[settings.MASTER_PORT])
        checks["addr"], ip = _resolve(addr, self.dl.step(5.0))
        if ip is None:
            return
        timeout = datetime.timedelta(seconds=self.dl.step())
        host = self.rank == 0 and not self.agent_store
        if host:
            checks["addr"] = _check_master_is_here(addr, ip)
            if checks["addr"].failed:
                return  # the store's own client would dial MASTER_ADDR: another host
            try:
                self.store = TCPStore(addr, port, None, True, timeout, wait_for_workers=False)
            except Exception as exc:  # noqa: BLE001 - reported with its fix
                in_use = "in use" in str(exc).lower()
                checks["port"] = Check(
                    FAIL,
                    f"cannot listen on MASTER_PORT {port}: {str(exc).splitlines()[0]}",
                    "another process holds the port (a leftover job, or a second rank 0): "
                    "choose a free MASTER_PORT"
                    if in_use
                    else _FIX_LAUNCHER,
                )
                return
            checks["port"] = Check(OK, f"listening on {port}")
        else:
            checks["port"] = _probe_port(addr, port, self.dl.step())
            if checks["port"].failed:
                return
            finished, value = _bounded(
                lambda: TCPStore(addr, port, None, False, timeout), self.dl.step() + 1
            )
            if not finished:
                checks["store"] = Check(
                    FAIL,
                    f"cannot connect to the c10d store at {addr}:{port}: {value}",
                    "MASTER_PORT answers but is not a c10d store: another program uses it",
                )
                return
            self.store = value
        finished, value = _bounded(
            lambda: _round_trip(self.store, self.prefix + f"rtt/{self.rank}/{os.getpid()}"),
            self.dl.step(),
        )
        checks["store"] = (
            value
            if finished
            else Check(FAIL, f"set+get failed: {value}", "the store host is overloaded or gone")
        )
        if checks["store"].failed:
            self.store = None
            return
        import torch

        checks["restart"] = check_restart(self.env, self.store, torch.__version__)

    def _publish(self, key: str, value: str) -> None:
        self.store.set(self.prefix + key, value)

    def _wait_key(self, key: str, until: float) -> str | None:
        """Poll for ``key`` until the monotonic time ``until``; never block past it."""
        full = self.prefix + key
        while True:
            try:
                if self.store.check([full]):
                    return self.store.get(full).decode()
            except Exception:  # noqa: BLE001 - the store host left: the key will not come
                return None
            if time.monotonic() >= until:
                return None
            time.sleep(_POLL_S)

    def _collective(self, world: int) -> Check:
        import torch
        import torch.distributed as dist

        seconds = self.dl.step()

        def run() -> float:
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(self.prefix + "pg", self.store),
                rank=self.rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=seconds),
            )
            t = torch.tensor([float(self.rank + 1)])
            dist.all_reduce(t)
            return float(t.item())

        t0 = time.monotonic()
        finished, value = _bounded(run, seconds + 1)
        if finished and value == world * (world + 1) / 2:
            took = time.monotonic() - t0
            if self.links_mib > 0:
                self._links(dist)
            _bounded(dist.destroy_process_group, 2.0)
            return Check(OK, f"all_reduce in {took * 1e3:.0f} ms")
        if finished:
            return Check(FAIL, f"all_reduce returned {value}", _FIX_GLOO)
        first = str(value).splitlines()[0] if str(value) else type(value).__name__
        return Check(FAIL, f"gloo all_reduce: {first}", _FIX_GLOO)

    def _links(self, dist: Any) -> None:
        """Measure the links between nodes in the live group; publish this rank's pairs."""

        def run() -> list[links.Pair]:
            hosts: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(hosts, socket.gethostname())
            return links.measure(dist, dist.get_rank(), hosts, self.links_mib)

        finished, value = _bounded(run, self.dl.left())
        if finished and isinstance(value, list):
            self._publish(f"links/{self.rank}", json.dumps([asdict(p) for p in value]))
        else:
            first = str(value).splitlines()[0] if str(value) else "no result in time"
            self._publish(f"links/{self.rank}", json.dumps({"error": first}))

    def _judge_links(self, reports: list[Report], notes: list[str]) -> None:
        """Collect every rank's measured pairs; name the node whose links are slow."""
        pairs: list[links.Pair] = []
        errors: dict[int, str] = {}
        for rep in reports:
            got = self._wait_key(f"links/{rep.rank}", self.dl.end)
            found = json.loads(got) if got else {"error": f"no result within {self.timeout:.0f} s"}
            if isinstance(found, dict):
                errors[rep.rank] = found["error"]  # type: ignore[index]
            else:
                pairs += [links.Pair(**p) for p in found]
        slow = links.judge(pairs)
        # The ranks that measured for their node (every rank reported: the gloo group ran).
        first_on = links.representatives(
            [r.host for r in sorted(reports, key=lambda r: r.rank or 0)]
        )
        for rep in reports:
            if rep.rank in errors:
                rep.checks["links"] = Check(FAIL, f"links: {errors[rep.rank]}", _FIX_GLOO)
            elif rep.host in slow and first_on[rep.host] == rep.rank:
                rep.checks["links"] = Check(
                    FAIL,
                    f"{rep.host}: {slow[rep.host]}",
                    f"check {rep.host}'s NIC (negotiated speed, errors: ethtool, ip -s link), its "
                    "cable and switch port, and other traffic on it; drain it until it is fixed",
                )
            else:
                rep.checks["links"] = Check(OK)
        if pairs:
            notes.extend(links.render(pairs, self.links_mib))
        if len({r.host for r in reports}) == 2:
            notes.append(
                "links: 2 nodes, one pair: no third node to tell which end is slow (run with a "
                "healthy third node to name it)"
            )
        elif len({r.host for r in reports}) < 2:
            notes.append("links: one node: no link between nodes to measure")

    # -- roles -------------------------------------------------------------------------------
    def _alone(self) -> int:
        """Print this rank's failures when it cannot reach the others (nobody else can)."""
        text = _own_failures(self.report)
        print(text or "ddp-exporter doctor: could not reach the store", file=sys.stderr, flush=True)
        if self.env.get(settings.TORCHELASTIC_RUN_ID):
            # torchrun's agent stops every worker when one exits non-zero: stay until rank 0
            # has printed its table (it is done by then).
            time.sleep(self.dl.left() + VERDICT_GRACE_S)
        return 1

    def _rank0(self) -> int:
        assert self.world is not None
        # Leave time for the collective after the gather, unless a rank never comes.
        reserve = min(self.dl.step_s + 2, self.timeout / 2)
        reports = self._gather(self.dl.end - reserve)
        rows, notes = compare(reports, self.world)
        complete = all(isinstance(r, Report) for r in rows) and len(rows) == self.world
        if complete:
            self._publish("peers", json.dumps({str(r.rank): r.reach for r in reports}))
            self._publish("plan", "go")
            reachable = self._judge_reach(reports, notes)
            self._publish("gloo", "go" if reachable else "skip")
            if reachable:
                self._gloo(reports, notes)
            else:
                notes.append("gloo all_reduce skipped: the ranks cannot all reach each other")
        else:
            self._publish("plan", "skip")
            notes.append("gloo all_reduce skipped: it needs every rank, each exactly once")
        missing = (
            f"it never reported within {self.dl.elapsed():.0f} s: check that it was started "
            "(launcher logs) and read its own doctor output (a rank that cannot reach "
            "MASTER_ADDR:MASTER_PORT reports only there)"
        )
        text = render(rows, notes, missing, self.columns)
        failed = any(isinstance(r, int) or r.failures() for r in rows)
        verdict = 1 if failed else 0
        mode = "torchrun agent store" if self.agent_store else "store hosted by rank 0"
        head = (
            f"ddp-exporter doctor: {self.world} rank{'' if self.world == 1 else 's'}, MASTER "
            f"{self.env[settings.MASTER_ADDR]}:{self.env[settings.MASTER_PORT]} ({mode})"
        )
        warned = " (see WARN above)" if "\nWARN " in f"\n{text}" else ""
        tail = (
            f"ddp-exporter doctor: {'FAIL' if failed else 'all checks passed' + warned} "
            f"after {self.dl.elapsed():.1f} s"
        )
        sys.stdout.write(f"{head}\n{text}\n{tail}\n")
        sys.stdout.flush()
        self._publish("verdict", str(verdict))
        # Keep a store hosted here up until the others read the verdict (bounded).
        until = time.monotonic() + VERDICT_GRACE_S
        while self.store.add(self.prefix + "read", 0) < len(reports) - 1:
            if time.monotonic() >= until:
                break
            time.sleep(_POLL_S)
        return verdict

    def _judge_reach(self, reports: list[Report], notes: list[str]) -> bool:
        """Collect every rank's reach attempts; set their checks; say whether all reached all."""
        assert self.world is not None
        self._reach()
        failed: dict[int, dict[int, str]] = {}
        until = min(self.dl.end, time.monotonic() + REACH_S + self.dl.step_s)
        for rep in reports:
            got = self._wait_key(f"reach/{rep.rank}", until)
            if got is not None and rep.rank is not None:
                failed[rep.rank] = {int(p): k for p, k in json.loads(got).items()}
        checks, more = judge_reach(reports, failed, self.world)
        for rep in reports:
            if rep.rank in checks and not rep.checks.get("reach", Check(OK)).failed:
                rep.checks["reach"] = checks[rep.rank]
        notes.extend(more)
        return all(not rep.checks["reach"].failed for rep in reports)

    def _gloo(self, reports: list[Report], notes: list[str]) -> None:
        """Run the gloo all_reduce with every rank; set each rank's check from its result."""
        assert self.world is not None
        mine = self._collective(self.world)
        self._publish(f"gloo/{self.rank}", json.dumps(asdict(mine)))
        for rep in reports:
            got = self._wait_key(f"gloo/{rep.rank}", self.dl.end)
            rep.checks["gloo"] = (
                Check(**json.loads(got))
                if got
                else Check(FAIL, f"no all_reduce result within {self.timeout:.0f} s", _FIX_GLOO)
            )
        if self.links_mib > 0 and not mine.failed:
            self._judge_links(reports, notes)

    def _gather(self, until: float) -> list[Report]:
        reports: dict[int, Report] = {}
        while True:
            count = self.store.add(self.prefix + "arrived", 0)
            for i in range(1, count + 1):
                key = self.prefix + f"report/{i}"
                if i not in reports and self.store.check([key]):
                    reports[i] = Report.from_json(self.store.get(key))
            ranks = {r.rank for r in reports.values()}
            if len(reports) >= self.world and ranks >= set(range(self.world)):
                break
            if time.monotonic() >= until:
                break
            time.sleep(_POLL_S)
        return list(reports.values())

    def _peer(self) -> int:
        plan = self._wait_key("plan", self.dl.end)
        if plan == "go":
            assert self.world is not None
            self._reach()
            if self._wait_key("gloo", self.dl.end) == "go":
                mine = self._collective(self.world)
                self.report.checks["gloo"] = mine
                self._publish(f"gloo/{self.rank}", json.dumps(asdict(mine)))
        own = _own_failures(self.report)
        if own:
            print(own, file=sys.stderr, flush=True)
        verdict = self._wait_key("verdict", self.dl.end + VERDICT_GRACE_S)
        try:
            self.store.add(self.prefix + "read", 1)
        except Exception:  # noqa: BLE001 - rank 0 already left; nothing to tell it
            pass
        if verdict is None:
            print(
                f"ddp-exporter doctor rank {self.rank}: no verdict from rank 0 within "
                f"{self.timeout:.0f} s; read rank 0's output",
                file=sys.stderr,
                flush=True,
            )
            return 1
        return 1 if own else int(verdict)


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the doctor on this rank; return the exit status (0: every check passed everywhere)."""
    return run(build_parser().parse_args(argv), environ)


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Run the doctor with parsed ``args``; return its exit status."""
    parser = args.parser
    if args.timeout <= 0 or args.step_timeout <= 0:
        parser.error("--timeout and --step-timeout must be positive")
    if args.links_mib <= 0:
        parser.error("--links-mib must be positive")
    environ = os.environ if environ is None else environ
    try:
        doctor = _Doctor(
            environ, args.timeout, args.step_timeout, args.links_mib if args.links else 0.0
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        code = doctor.run()
    except Exception as exc:  # noqa: BLE001 - a preflight reports, it never dies with a traceback
        print(f"ddp-exporter doctor: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    if _abandoned and any(t.is_alive() for t in _abandoned):
        # A step stuck in C++ (gloo, DNS) would keep the interpreter from exiting: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
