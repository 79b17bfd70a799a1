"""Read in-flight collective state of every process group, off the training thread.

The source is torch's Flight Recorder (``torch._C._distributed_c10d._dump_fr_trace``; gloo and
NCCL in recent torch), which sees every collective of every process group, not only DDP's. It
is a private API: feature-detected, and when it is missing or fails the exporter falls back to
its own comm-hook bookkeeping (DDP's buckets only) after one log line.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .errors import ErrorCounter, log
from .recorder import Recorder

__all__ = ["PGState", "FlightRecorderSource", "HookBookkeepingSource", "pg_timeout_seconds"]


@dataclass(frozen=True)
class PGState:
    """In-flight state of one process group on this rank."""

    pg: str
    last_enqueued: int
    last_completed: int
    inflight_age_s: float
    timeout_s: float | None


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


_DETECT = object()


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
        if dump is _DETECT:
            c10d = getattr(torch._C, "_distributed_c10d", None)
            dump = getattr(c10d, "_dump_fr_trace", None)
        self._dump = dump

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
        raw = self._dump(
            includeCollectives=include_collectives,
            includeStackTraces=False,
            onlyActive=include_collectives,
        )
        data = pickle.loads(raw)
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
