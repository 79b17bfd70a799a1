"""Read in-flight collective state of every process group, off the training thread.

The source is torch's Flight Recorder, which sees every collective of every process group, not
only DDP's. A CUDA build keeps NCCL's collectives in a recorder of their own
(``torch._C._distributed_c10d._dump_nccl_trace``, torch >= 2.4; its ``pg_status`` since 2.5) and
gloo's in the generic one (``_dump_fr_trace``, torch >= 2.8); a backend that records through
torch's Flight Recorder hook (``nccl2``) keeps one of its own (:mod:`exporter.sources.backends`).
All are read and merged. Each
recorder numbers its process groups itself (``pg_status`` is keyed by that number, which differs
between ranks when a rank is not in every group), so states are published under the group's
name, learnt from the recorder's entries. A recorder is on by default from torch 2.11
(``TORCH_FR_BUFFER_SIZE``, 2000 entries); with it off its ``pg_status`` is empty.

It is a private API: feature-detected, and when no recorder reports a process group, or one
fails, the exporter falls back to its own comm-hook bookkeeping (DDP's buckets only) after one
log line. A group whose backend no readable recorder holds (``nccl2`` on a torch that does not
expose its recorder) is named in a log line too, whichever source is used: on a GPU the
bookkeeping does not see a collective stuck on the device.

:class:`InFlight` is what the rest of the exporter reads: the scrape path and the hang watcher
share it, so the fallback happens once, in one place. :func:`read_trace` is the one reader of
a recorder's dump (the in-flight state here, the hang dumps' entries and stacks).
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist

from ..errors import ErrorCounter
from ..log import log
from .backends import BackendRecorder, backend_recorders, group_backends, unrecorded_groups
from .recorder import Recorder

__all__ = [
    "FlightRecorderSource",
    "HookBookkeepingSource",
    "InFlight",
    "InFlightSource",
    "PGState",
    "RECENT_ENTRIES",
    "dump_functions",
    "entries_report",
    "entry_group",
    "entry_op",
    "pg_timeout_seconds",
    "read_trace",
]

#: Retired Flight Recorder entries kept per process group in a hang dump, besides every
#: in-flight one.
RECENT_ENTRIES = 10

#: The recorders' dump functions: NCCL's (CUDA builds) first, then the generic one (gloo).
_DUMP_NAMES = ("_dump_nccl_trace", "_dump_fr_trace")


@dataclass(frozen=True)
class PGState:
    """In-flight state of one process group on this rank."""

    pg: str
    last_enqueued: int
    last_completed: int
    inflight_age_s: float
    timeout_s: float | None


_DETECT = object()


def dump_functions() -> tuple[Any, ...]:
    """Return this torch build's Flight Recorder dump functions (none: no Flight Recorder).

    NCCL's and the generic one, then a reader per backend of the job's process groups that
    keeps a recorder of its own (``nccl2``), as the groups stand now.
    """
    c10d = getattr(torch._C, "_distributed_c10d", None)
    found = (getattr(c10d, name, None) for name in _DUMP_NAMES)
    natives = tuple(f for f in found if callable(f))
    backends = {name for names in group_backends().values() for name in names}
    return natives + backend_recorders(backends)


def _dumps(dump: Any) -> tuple[Any, ...]:
    """Normalise a ``dump`` argument: detect, one function, a sequence, or None (none)."""
    if dump is _DETECT:
        return dump_functions()
    if dump is None:
        return ()
    return tuple(dump) if isinstance(dump, (list, tuple)) else (dump,)


def read_trace(
    dump: Any,
    *,
    collectives: bool = True,
    stacks: bool = False,
    only_active: bool = False,
) -> dict[str, Any]:
    """Return one recorder's dump as a dict (``pg_status``, ``entries``, ...).

    ``dump`` is the dump function: one that returns a pickled dict (torch's), or the dict itself
    (:class:`~exporter.sources.backends.BackendRecorder`). Raises whatever the private API raises.
    """
    raw = dump(includeCollectives=collectives, includeStackTraces=stacks, onlyActive=only_active)
    if isinstance(raw, dict):
        return raw
    # The recorder pickles a dict; torch's private API reads as untyped.
    return cast("dict[str, Any]", pickle.loads(raw))


def entry_group(entry: dict[str, Any]) -> tuple[str, str]:
    """Return ``(pg_status key, group name)`` of a recorder entry."""
    group = entry.get("process_group") or ("", "")
    name = str(group[0])
    return str(entry.get("pg_id", name)), name


def entry_op(entry: dict[str, Any]) -> str:
    """Return a recorder entry's op as torch names it (``profiling_name`` after the backend)."""
    return str(entry.get("profiling_name") or "").split(":", 1)[-1]


def entries_report(dump: Any = _DETECT) -> dict[str, Any]:
    """Return the Flight Recorders' entries for a hang dump: in flight, recent, with stacks.

    Never raises: ``{"available": False, "error": ...}`` when no Flight Recorder can be read.
    """
    dumps = _dumps(dump)
    if not dumps:
        return {"available": False, "error": "torch has no Flight Recorder dump function"}
    entries: list[dict[str, Any]] = []
    status: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for fn in dumps:
        try:
            data = read_trace(fn, collectives=True, stacks=True, only_active=False)
        except Exception as exc:  # noqa: BLE001 - private API
            errors.append(repr(exc))
            continue
        names: dict[str, str] = {}
        for e in data.get("entries", []) or []:
            key, name = entry_group(e)
            names[key] = name
            if not e.get("is_p2p"):
                entries.append(_entry(e, name))
        for key, st in (data.get("pg_status") or {}).items():
            simple = {k: v for k, v in st.items() if isinstance(v, (int, float, str))}
            status.setdefault(names.get(str(key), str(key)), simple)
    if errors and not entries and not status:
        return {"available": False, "error": "; ".join(errors)}
    inflight = [e for e in entries if not e["retired"] and e["state"] != "completed"]
    recent: list[dict[str, Any]] = []
    for pg in sorted({e["pg"] for e in entries}):
        recent += [e for e in entries if e["pg"] == pg and e["retired"]][-RECENT_ENTRIES:]
    return {"available": True, "pg_status": status, "inflight": inflight, "recent": recent}


def _entry(e: dict[str, Any], pg: str) -> dict[str, Any]:
    created = e.get("time_created_ns")
    return {
        "op": entry_op(e),
        "seq": int(e.get("collective_seq_id", -1)),
        "pg": pg,
        "pg_desc": str((e.get("process_group") or ("", ""))[-1]),
        "state": str(e.get("state", "")),
        "retired": bool(e.get("retired")),
        "input_sizes": e.get("input_sizes"),
        "output_sizes": e.get("output_sizes"),
        "dtypes": e.get("input_dtypes"),
        "created_unix": created / 1e9 if created else None,
        "timeout_s": (e.get("timeout_ms") or 0) / 1000.0 or None,
        # FR lists frames innermost first; keep tracebacks' order (outermost first).
        "frames": [
            {"file": f.get("filename", ""), "line": f.get("line"), "function": f.get("name")}
            for f in reversed(e.get("frames") or [])
        ],
    }


def _pg_objects() -> dict[str, dist.ProcessGroup]:
    try:
        names = dist.distributed_c10d._world.pg_names  # private: {ProcessGroup: name}
        return {name: pg for pg, name in names.items()}
    except Exception:  # noqa: BLE001 - private API; absent means "unknown"
        return {}


def pg_timeout_seconds(pg: dist.ProcessGroup) -> float | None:
    """Return the process group's collective timeout in seconds, or None if torch hides it."""
    try:
        devices = list(getattr(pg, "_device_types", [])) or [torch.device("cpu")]
        for device in devices:
            backend = pg._get_backend(torch.device(device))
            timeout = getattr(getattr(backend, "options", None), "_timeout", None)
            if isinstance(timeout, timedelta):
                return timeout.total_seconds()
    except Exception:  # noqa: BLE001 - private API
        pass
    try:
        backend = dist.get_backend(pg)
        default: timedelta = dist.distributed_c10d._get_default_timeout(backend)
        return default.total_seconds()
    except Exception:  # noqa: BLE001
        return None


class _Timeouts:
    """Cache per-pg timeouts (they are fixed at group creation)."""

    def __init__(self) -> None:
        self._cache: dict[str, float | None] = {}

    def get(self, name: str) -> float | None:
        if name not in self._cache:
            pg = _pg_objects().get(name)
            self._cache[name] = pg_timeout_seconds(pg) if pg is not None else None
        return self._cache[name]


class InFlightSource(Protocol):
    """What :class:`InFlight` reads: the Flight Recorders, the comm hook's counts, a stand-in."""

    @property
    def name(self) -> str:
        """Return the source's name (``ddp_rank_info{inflight_source}``)."""

    def read(self) -> list[PGState]:
        """Return one state per process group; may raise (the Flight Recorder's private API)."""


class HookBookkeepingSource:
    """Derive in-flight state from the comm-hook wrapper's own counts (DDP buckets only)."""

    name = "comm_hook"

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._timeouts = _Timeouts()

    def read(self) -> list[PGState]:
        """Return one state per process group the comm hook has seen."""
        return [
            PGState(pg, enq, done, age, self._timeouts.get(pg))
            for pg, enq, done, age in self._recorder.inflight()
        ]


class FlightRecorderSource:
    """Read sequence numbers and the oldest in-flight collective from the Flight Recorders."""

    name = "flight_recorder"

    def __init__(self, errors: ErrorCounter, dump: Any = _DETECT) -> None:
        """Use ``dump`` (one dump function, several, or None: none); by default torch's."""
        self._errors = errors
        self._timeouts = _Timeouts()
        self._dumps = _dumps(dump)
        # (recorder, pg_status key) -> group name, learnt from entries; fixed once known.
        self._names: dict[tuple[int, str], str] = {}

    @property
    def backends(self) -> tuple[str, ...]:
        """Return the backends read through a recorder of their own (``nccl2``)."""
        return tuple(d.backend for d in self._dumps if isinstance(d, BackendRecorder))

    def seen_groups(self) -> set[str]:
        """Return the groups named in the recorders' entries (none where a dump fails)."""
        seen: set[str] = set()
        for dump in self._dumps:
            try:
                entries = read_trace(dump, collectives=True).get("entries") or []
            except Exception:  # noqa: BLE001 - private API: a recorder that fails saw nothing
                continue
            seen.update(entry_group(e)[1] for e in entries)
        return seen

    @property
    def readable(self) -> bool:
        """Say whether a Flight Recorder of this torch can be read (it may report no group yet)."""
        try:
            return any(isinstance(read_trace(fn, collectives=False), dict) for fn in self._dumps)
        except Exception:  # noqa: BLE001 - private API
            return False

    @property
    def available(self) -> bool:
        """Say whether a Flight Recorder of this torch reports a process group (usable)."""
        if not self._dumps:
            return False
        try:
            return any(self._status(fn, False)[0] for fn in self._dumps)
        except Exception as exc:  # noqa: BLE001
            log.info(
                "ddp-exporter: Flight Recorder unusable (%r); using comm-hook bookkeeping", exc
            )
            return False

    def _status(
        self, dump: Any, include_collectives: bool
    ) -> tuple[dict[Any, Any], list[dict[str, Any]]]:
        data = read_trace(dump, collectives=include_collectives, only_active=include_collectives)
        status = data.get("pg_status") or {}
        if not isinstance(status, dict):
            raise TypeError(f"Flight Recorder pg_status is {type(status).__name__}, not dict")
        return status, data.get("entries", []) or []

    def _learn_names(self, index: int, dump: Any, keys: list[str]) -> None:
        """Map ``pg_status`` keys to group names from every entry; a key with none keeps itself."""
        for e in read_trace(dump, collectives=True, only_active=False).get("entries") or []:
            key, name = entry_group(e)
            self._names.setdefault((index, key), name)
        for key in keys:
            self._names.setdefault((index, key), key)

    def read(self) -> list[PGState]:
        """Return one state per process group the Flight Recorders know."""
        out: dict[str, PGState] = {}
        for index, dump in enumerate(self._dumps):
            for state in self._read_one(index, dump):
                # A group with a gloo and an NCCL backend is in both recorders: the first
                # (NCCL, the gradients') is published.
                out.setdefault(state.pg, state)
        return list(out.values())

    def _read_one(self, index: int, dump: Any) -> list[PGState]:
        status, _ = self._status(dump, False)
        unknown = [str(k) for k in status if (index, str(k)) not in self._names]
        if unknown:
            self._learn_names(index, dump, unknown)
        oldest: dict[str, tuple[int, float | None]] = {}
        if any(
            int(s.get("last_enqueued_collective", -1)) > int(s.get("last_completed_collective", -1))
            for s in status.values()
        ):
            # Only pay for the entry list when something is in flight.
            _, entries = self._status(dump, True)
            for e in entries:
                if e.get("retired") or e.get("is_p2p"):
                    continue
                key, _ = entry_group(e)
                created = int(e.get("time_created_ns") or 0)
                tmo = e.get("timeout_ms")
                if created and (key not in oldest or created < oldest[key][0]):
                    oldest[key] = (created, tmo / 1000.0 if tmo else None)
        now_ns = time.time_ns()
        out = []
        for key, s in status.items():
            key = str(key)
            pg = self._names.get((index, key), key)
            enq = int(s.get("last_enqueued_collective", -1))
            done = int(s.get("last_completed_collective", -1))
            age, tmo = 0.0, None
            if enq > done and key in oldest:
                created, tmo = oldest[key]
                age = max(0.0, (now_ns - created) / 1e9)
            out.append(PGState(pg, enq, done, age, tmo or self._timeouts.get(pg)))
        return out


def log_unrecorded(
    backends: dict[str, tuple[str, ...]], recorders: FlightRecorderSource
) -> dict[str, str]:
    """Log, in one line, the groups whose backend no recorder read here holds; return them.

    ``backends``: each group's backends (:func:`~exporter.sources.backends.group_backends`);
    ``recorders``: the Flight Recorders read. A group found in their entries is recorded,
    whatever its backend.
    """
    missing = unrecorded_groups(backends, recorders.backends)
    if missing:  # only then read every entry: the groups they name
        missing = unrecorded_groups(backends, recorders.backends, recorders.seen_groups())
    if missing:
        shown = ", ".join(f"{g} ({b})" for g, b in list(missing.items())[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        # nccl2 records once torch attaches its hook: by itself where TORCH_FR_BUFFER_SIZE is
        # set, in a torch newer than 2.14; by hand (FlightRecorderHook.attach) in 2.14.
        fix = (
            " Set TORCH_FR_BUFFER_SIZE=2000 before init_process_group, or train on NCCL's "
            "legacy backend ('nccl-legacy', or TORCH_DIST_USE_NCCL2=0)."
            if any("nccl2" in b.split(",") for b in missing.values())
            else ""
        )
        log.warning(
            "ddp-exporter: no Flight Recorder the exporter can read records process group %s%s; "
            "a collective stuck in it shows in no in-flight state, only as a step that stops.%s",
            shown,
            more,
            fix,
        )
    return missing


class InFlight:
    """The in-flight state this rank publishes: the Flight Recorder, or the comm hook's counts.

    Starts with the Flight Recorder when asked for and usable, else with the comm-hook
    bookkeeping. The first time the Flight Recorder fails, the error is counted and every later
    read uses the bookkeeping: the scrape path and the hang watcher read this one object.
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        *,
        flight_recorder: bool = True,
        source: InFlightSource | None = None,
        before_first_collective: bool = False,
    ) -> None:
        """Choose the source: ``source``, else the Flight Recorder if usable, else bookkeeping.

        ``before_first_collective``: no collective ran yet (FSDP2 and loops without DDP, whose
        every collective the bookkeeping counts), so a readable Flight Recorder that reports no
        group yet is taken on probation: once the bookkeeping has seen a collective the recorder
        did not, it is off (``TORCH_FR_BUFFER_SIZE=0``) and the bookkeeping is used from then on.
        """
        self._recorder = recorder
        self._errors = errors
        self._probation = False
        if source is None and flight_recorder:
            fr = FlightRecorderSource(errors)
            log_unrecorded(group_backends(), fr)
            if fr.available:
                source = fr
            elif before_first_collective and fr.readable:
                source, self._probation = fr, True
            else:
                log.info(
                    "ddp-exporter: torch %s has no usable Flight Recorder; in-flight state "
                    "covers DDP buckets only",
                    torch.__version__,
                )
        self.source: InFlightSource = (
            source if source is not None else HookBookkeepingSource(recorder)
        )

    @property
    def name(self) -> str:
        """Return the source in use (``ddp_rank_info{inflight_source}``)."""
        return self.source.name

    def use(self, source: InFlightSource) -> None:
        """Read from ``source`` from now on (tests inject a failing Flight Recorder)."""
        self.source = source

    def fail(self, exc: BaseException) -> None:
        """Count ``exc`` and fall back to the comm-hook bookkeeping for good."""
        self._errors.record("flight_recorder", exc)
        self.source = HookBookkeepingSource(self._recorder)

    def read(self) -> list[PGState]:
        """Return one state per process group; on a Flight Recorder error, fall back and retry."""
        try:
            states = self.source.read()
        except Exception as exc:  # noqa: BLE001 - a private API: fall back once
            self.fail(exc)
            return self.source.read()
        if self._probation:
            if states:
                self._probation = False  # it records: keep it
            else:
                book = HookBookkeepingSource(self._recorder)
                seen = book.read()
                if seen:
                    self._probation = False
                    log.info(
                        "ddp-exporter: the Flight Recorder records no collective (off?); "
                        "in-flight state comes from the exporter's own bookkeeping"
                    )
                    self.source = book
                    return seen
        return states
