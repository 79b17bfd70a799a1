"""Publish liveness through the c10d store, and let one rank watch every peer.

Heartbeats go through the store, never through collectives: a heartbeat built from
send/recv hangs together with the job, exactly when it is needed. Each rank bumps one
counter key every ``interval_s`` (``Store.add``: one round trip). The monitoring rank reads
all counters with one batched ``multi_get`` per interval and timestamps each change with its
own monotonic clock, so ages are immune to clock skew between nodes. At 4,096 ranks and 5 s
that is ~820 tiny writes/s and one read per interval on the store.
"""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from .errors import ErrorCounter

__all__ = ["Heartbeat", "heartbeat_key"]


def heartbeat_key(run: str, rank: int) -> str:
    """Return the store key holding ``rank``'s heartbeat counter."""
    return f"ddp_exporter/{run}/hb/{rank}"


class Heartbeat:
    """Beat this rank's counter; on the monitoring rank, also track every peer's age."""

    def __init__(
        self,
        store: dist.Store,
        run: str,
        rank: int,
        world_size: int,
        interval_s: float,
        monitor: bool,
        errors: ErrorCounter,
        clock=time.monotonic,
    ) -> None:
        self._store = store
        self._key = heartbeat_key(run, rank)
        self._keys = [heartbeat_key(run, r) for r in range(world_size)]
        self._interval = interval_s
        self._errors = errors
        self._clock = clock
        self.monitor = monitor
        self._lock = threading.Lock()
        self._seen: list[tuple[bytes, float]] | None = None
        self._paused = threading.Event()  # set: stop beating (tests simulate a frozen rank)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Beat once synchronously (peers see this rank at once), then in the background."""
        self._beat()
        if self.monitor:
            for key in self._keys:
                self._store.add(key, 0)  # create missing keys without clobbering live ones
            self._poll()
        self._thread = threading.Thread(
            target=self._run, name="ddp-exporter-heartbeat", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        self._store.add(self._key, 1)

    def _poll(self) -> None:
        values = self._store.multi_get(self._keys)
        now = self._clock()
        with self._lock:
            if self._seen is None:
                self._seen = [(v, now) for v in values]
            else:
                self._seen = [
                    (v, t if v == old else now) for v, (old, t) in zip(values, self._seen)
                ]

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._paused.is_set():
                    self._beat()
                if self.monitor:
                    self._poll()
            except Exception as exc:  # noqa: BLE001 - a dead store must not kill training
                self._errors.record("heartbeat", exc)

    def pause(self, paused: bool = True) -> None:
        """Stop (or resume) beating while the process stays alive; used by fault drills."""
        if paused:
            self._paused.set()
        else:
            self._paused.clear()

    def peer_ages(self) -> list[float]:
        """Return seconds since each peer's counter last changed (monitoring rank only)."""
        now = self._clock()
        with self._lock:
            if self._seen is None:
                return []
            return [now - t for _, t in self._seen]

    def close(self) -> None:
        """Stop the thread (it may be stuck on a dead store; it is a daemon then)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
