"""Publish liveness through the c10d store, and let one rank watch every peer.

Heartbeats go through the store, never through collectives: a heartbeat built from
send/recv hangs together with the job, exactly when it is needed. Each rank bumps one
counter key every ``interval_s`` (``Store.add``: one round trip). The monitoring rank reads
all counters with one batched ``multi_get`` per interval and timestamps each change with its
own monotonic clock, so ages are immune to clock skew between nodes. At 4,096 ranks and 5 s
that is ~820 tiny writes/s and one read per interval on the store.

What the monitoring rank publishes stays bounded: every peer's age while the job has at most
``peer_series`` ranks, else only the peers that are late (no change for over
:data:`LATE_AFTER_INTERVALS` intervals), oldest first, at most ``peer_series`` of them.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from ..background import BackgroundLoop
from ..errors import ErrorCounter
from ..settings import DEFAULT_PEER_SERIES
from ..storekeys import Keys

__all__ = ["END_MARK", "LATE_AFTER_INTERVALS", "Heartbeat"]

#: A live peer's age stays under about two intervals (its beats and the polls drift apart);
#: a peer unchanged for longer than this many intervals is late and always a candidate.
LATE_AFTER_INTERVALS = 3
#: Added to a rank's counter when it ends cleanly: a peer whose counter is at least this much
#: has finished, it is not late (``add`` is the only write, so the mark rides on the counter).
END_MARK = 1 << 40


class Heartbeat:
    """Beat this rank's counter; on the monitoring rank, also track every peer's age."""

    def __init__(
        self,
        store: Any,
        keys: Keys,
        rank: int,
        world_size: int,
        interval_s: float,
        monitor: bool,
        errors: ErrorCounter,
        clock: Callable[[], float] = time.monotonic,
        peer_series: int = DEFAULT_PEER_SERIES,
    ) -> None:
        self._store = store
        self._key = keys.heartbeat(rank)
        self._keys = [keys.heartbeat(r) for r in range(world_size)]
        self._interval = interval_s
        self._clock = clock
        self.monitor = monitor
        self.peer_series = peer_series
        self._lock = threading.Lock()
        self._seen: list[tuple[bytes, float]] | None = None
        self._done: frozenset[int] = frozenset()
        self._paused = threading.Event()  # set: stop beating (tests simulate a frozen rank)
        #: Seconds the last beat (one ``add``) took; None before the first.
        self.round_trip_s: float | None = None
        self._loop = BackgroundLoop(
            "ddp-exporter-heartbeat", self._tick, interval_s, errors=errors, where="heartbeat"
        )

    def start(self) -> Heartbeat:
        """Beat once synchronously (peers see this rank at once), then in the background."""
        if self._beat() >= END_MARK:
            # An earlier instrument() of this process ended cleanly: this one runs again.
            self._store.add(self._key, -END_MARK)
        if self.monitor:
            for key in self._keys:
                self._store.add(key, 0)  # create missing keys without clobbering live ones
            self.poll()
        self._loop.start()
        return self

    def _beat(self) -> int:
        """Bump this rank's counter (one round trip, timed); return its new value."""
        start = time.perf_counter()
        count = cast(int, self._store.add(self._key, 1))  # torch's Store reads as untyped
        # Free to measure, and the one per-rank timing a slow link on this node inflates
        # (the collectives' own latency is the same on every rank: they wait for each other).
        self.round_trip_s = time.perf_counter() - start
        return count

    def poll(self) -> None:
        """Read every peer's counter once (the monitoring rank's thread does so each interval)."""
        values = self._store.multi_get(self._keys)
        now = self._clock()
        # A clean end adds END_MARK: with 13 digits or more a counter is surely marked.
        done = frozenset(
            peer for peer, v in enumerate(values) if len(v) >= 13 and _count(v) >= END_MARK
        )
        with self._lock:
            if self._seen is None:
                self._seen = [(v, now) for v in values]
            else:
                self._seen = [
                    (v, t if v == old else now) for v, (old, t) in zip(values, self._seen)
                ]
            self._done = done

    def _tick(self) -> None:
        # A dead store raises here: the loop counts it and training goes on.
        if not self._paused.is_set():
            self._beat()
        if self.monitor:
            self.poll()

    def pause(self, paused: bool = True) -> None:
        """Stop (or resume) beating while the process stays alive; used by fault drills."""
        if paused:
            self._paused.set()
        else:
            self._paused.clear()

    def finish(self) -> None:
        """Mark this rank's counter as ended cleanly (the monitoring rank stops counting it)."""
        self._store.add(self._key, END_MARK)

    def peer_ages(self) -> list[float]:
        """Return seconds since each peer's counter last changed (monitoring rank only)."""
        now = self._clock()
        with self._lock:
            if self._seen is None:
                return []
            return [now - t for _, t in self._seen]

    def finished_peers(self) -> frozenset[int]:
        """Return the peers that ended cleanly, as of the last poll (monitoring rank only)."""
        return self._done

    def ended_count(self) -> int:
        """Return how many ranks ended cleanly, as of the last poll (monitoring rank only)."""
        return len(self._done)

    def published_ages(self) -> list[tuple[int, float]]:
        """Return the ``(peer, age)`` pairs to publish, by peer; see the module docstring.

        A peer that ended cleanly is left out: it is gone, not late.
        """
        done = self.finished_peers()
        ages = [(peer, age) for peer, age in enumerate(self.peer_ages()) if peer not in done]
        if len(ages) + len(done) <= self.peer_series:
            return ages
        late_after = LATE_AFTER_INTERVALS * self._interval
        late = [(peer, age) for peer, age in ages if age > late_after]
        if len(late) > self.peer_series:
            late = heapq.nlargest(self.peer_series, late, key=lambda pa: pa[1])
        return sorted(late)

    def published_arrivals(self) -> list[tuple[int, bool]]:
        """Return ``(peer, ever beaten)`` for the peers :meth:`published_ages` selects.

        The monitoring rank created every counter at zero, so zero is a peer never seen.
        """
        with self._lock:
            seen = self._seen
        if seen is None:
            return []
        return [(peer, seen[peer][0] not in (b"", b"0")) for peer, _ in self.published_ages()]

    def stop(self) -> None:
        """Ask the thread to stop without waiting for it (it ends within one interval)."""
        self._loop.stop()

    def close(self) -> None:
        """Stop the thread (it may be stuck on a dead store; it is a daemon then)."""
        self._loop.close()


def _count(value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        return 0
