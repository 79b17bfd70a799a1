"""Read in-flight collective state of every process group, off the training thread.

The source is torch's Flight Recorder (``torch._C._distributed_c10d._dump_fr_trace``; gloo and
NCCL in recent torch), which sees every collective of every process group, not only DDP's. It
is a private API: feature-detected, and when it is missing or fails the exporter falls back to
its own comm-hook bookkeeping (DDP's buckets only) after one log line.

:class:`InFlight` is what the rest of the exporter reads: the scrape path and the hang watcher
share it, so the fallback happens once, in one place. :func:`read_trace` is the one reader of
the Flight Recorder's dump (the in-flight state here, the hang dumps' entries and stacks).
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..errors import ErrorCounter
from ..log import log
from .recorder import Recorder

__all__ = [
    "FlightRecorderSource",
    "HookBookkeepingSource",
    "InFlight",
    "PGState",
    "RECENT_ENTRIES",
    "dump_function",
    "entries_report",
    "pg_timeout_seconds",
    "read_trace",
]

#: Retired Flight Recorder entries kept per process group in a hang dump, besides every
#: in-flight one.
RECENT_ENTRIES = 10


@dataclass(frozen=True)
class PGState:
    """In-flight state of one process group on this rank."""

    pg: str
    last_enqueued: int
    last_completed: int
    inflight_age_s: float
    timeout_s: float | None


_DETECT = object()


def dump_function() -> Any:
    """Return torch's Flight Recorder dump function, or None when this build has none."""
    c10d = getattr(torch._C, "_distributed_c10d", None)
    return getattr(c10d, "_dump_fr_trace", None)


def read_trace(
    dump: Any = _DETECT,
    *,
    collectives: bool = True,
    stacks: bool = False,
    only_active: bool = False,
) -> dict:
    """Return the Flight Recorder's dump as a dict (``pg_status``, ``entries``, ...).

    ``dump`` is the dump function (by default torch's, looked up now). Raises whatever the
    private API raises, and RuntimeError when this build has no Flight Recorder.
    """
    if dump is _DETECT:
        dump = dump_function()
    if dump is None:
        raise RuntimeError("torch has no _dump_fr_trace")
    raw = dump(includeCollectives=collectives, includeStackTraces=stacks, onlyActive=only_active)
    return pickle.loads(raw)


def entries_report(dump: Any = _DETECT) -> dict:
    """Return the Flight Recorder's entries for a hang dump: in flight, recent, with stacks.

    Never raises: ``{"available": False, "error": ...}`` when the Flight Recorder cannot be read.
    """
    try:
        data = read_trace(dump, collectives=True, stacks=True, only_active=False)
    except Exception as exc:  # noqa: BLE001 - private API
        return {"available": False, "error": repr(exc)}
    entries = []
    for e in data.get("entries", []) or []:
        if e.get("is_p2p"):
            continue
        name = str(e.get("profiling_name") or "")
        created = e.get("time_created_ns")
        entries.append(
            {
                "op": name.split(":", 1)[-1],
                "seq": int(e.get("collective_seq_id", -1)),
                "pg": str((e.get("process_group") or ("",))[0]),
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
                    {
                        "file": f.get("filename", ""),
                        "line": f.get("line"),
                        "function": f.get("name"),
                    }
                    for f in reversed(e.get("frames") or [])
                ],
            }
        )
    inflight = [e for e in entries if not e["retired"] and e["state"] != "completed"]
    recent: list[dict] = []
    for pg in sorted({e["pg"] for e in entries}):
        recent += [e for e in entries if e["pg"] == pg and e["retired"]][-RECENT_ENTRIES:]
    status = {
        str(pg): {k: v for k, v in s.items() if isinstance(v, (int, float, str))}
        for pg, s in (data.get("pg_status") or {}).items()
    }
    return {"available": True, "pg_status": status, "inflight": inflight, "recent": recent}


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
        return dist.distributed_c10d._get_default_timeout(backend).total_seconds()
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
    """Read sequence numbers and the oldest in-flight collective from the Flight Recorder."""

    name = "flight_recorder"

    def __init__(self, errors: ErrorCounter, dump=_DETECT) -> None:
        """Use ``dump`` as the dump function; by default look it up in torch (None: absent)."""
        self._errors = errors
        self._timeouts = _Timeouts()
        self._dump = dump_function() if dump is _DETECT else dump

    @property
    def available(self) -> bool:
        """Say whether this torch build has a working Flight Recorder."""
        if self._dump is None:
            return False
        try:
            status = self._status(include_collectives=False)[0]
        except Exception as exc:  # noqa: BLE001
            log.info(
                "ddp-exporter: Flight Recorder unusable (%r); using comm-hook bookkeeping", exc
            )
            return False
        return isinstance(status, dict)

    def _status(self, include_collectives: bool) -> tuple[dict, list]:
        data = read_trace(
            self._dump, collectives=include_collectives, only_active=include_collectives
        )
        return data.get("pg_status", {}), data.get("entries", []) or []

    def read(self) -> list[PGState]:
        """Return one state per process group the Flight Recorder knows."""
        status, _ = self._status(include_collectives=False)
        oldest: dict[str, tuple[int, float | None]] = {}
        if any(
            int(s.get("last_enqueued_collective", -1)) > int(s.get("last_completed_collective", -1))
            for s in status.values()
        ):
            # Only pay for the entry list when something is in flight.
            _, entries = self._status(include_collectives=True)
            for e in entries:
                if e.get("retired") or e.get("is_p2p"):
                    continue
                pg = e.get("process_group", ("",))[0]
                created = int(e.get("time_created_ns") or 0)
                tmo = e.get("timeout_ms")
                if created and (pg not in oldest or created < oldest[pg][0]):
                    oldest[pg] = (created, tmo / 1000.0 if tmo else None)
        now_ns = time.time_ns()
        out = []
        for pg, s in status.items():
            enq = int(s.get("last_enqueued_collective", -1))
            done = int(s.get("last_completed_collective", -1))
            age, tmo = 0.0, None
            if enq > done and pg in oldest:
                created, tmo = oldest[pg]
                age = max(0.0, (now_ns - created) / 1e9)
            out.append(PGState(pg, enq, done, age, tmo or self._timeouts.get(pg)))
        return out


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
        source: Any = None,
    ) -> None:
        self._recorder = recorder
        self._errors = errors
        if source is None and flight_recorder:
            fr = FlightRecorderSource(errors)
            if fr.available:
                source = fr
            else:
                log.info(
                    "ddp-exporter: torch %s has no usable Flight Recorder; in-flight state "
                    "covers DDP buckets only",
                    torch.__version__,
                )
        self.source: Any = source if source is not None else HookBookkeepingSource(recorder)

    @property
    def name(self) -> str:
        """Return the source in use (``ddp_rank_info{inflight_source}``)."""
        return self.source.name

    def use(self, source: Any) -> None:
        """Read from ``source`` from now on (tests inject a failing Flight Recorder)."""
        self.source = source

    def fail(self, exc: BaseException) -> None:
        """Count ``exc`` and fall back to the comm-hook bookkeeping for good."""
        self._errors.record("flight_recorder", exc)
        self.source = HookBookkeepingSource(self._recorder)

    def read(self) -> list[PGState]:
        """Return one state per process group; on a Flight Recorder error, fall back and retry."""
        try:
            return self.source.read()
        except Exception as exc:  # noqa: BLE001 - a private API: fall back once
            self.fail(exc)
            return self.source.read()
