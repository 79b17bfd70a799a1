"""Tell the goodput account of the run's hang episodes: their onset, culprit and the abort.

:func:`start_goodput` starts a rank's goodput account (:mod:`exporter.sources.goodput`) beside its
heartbeat, its monitoring rank reading the episodes through an :class:`EpisodeFeed`.

The monitoring rank's hang watcher opens an episode by bumping a counter in the store and
setting its request (:mod:`exporter.hangs.monitor`); the account (:mod:`exporter.sources.goodput`)
reads the latest one from the store here, on its own thread, and the abort from the watcher.
The onset is the stalled collective's start as the watcher measured it (the request's time less
the age it had then); the culprit's node is what the culprit said in its first ack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..errors import ErrorCounter
from ..settings import Endpoint, Identity
from ..sources.ending import End
from ..sources.goodput import Episode, GoodputTracker
from ..sources.recorder import Recorder
from ..sources.sections import REGISTRY
from ..storekeys import for_run
from .channel import Channel, Store

__all__ = ["EpisodeFeed", "start_goodput"]


class _Aborted(Protocol):
    """The part of the hang watcher the feed reads."""

    @property
    def aborted(self) -> tuple[float, str, str] | None:
        """Return ``(unix time, culprit rank label, its node)`` once the action decided."""
        ...

    def when_aborting(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once this rank leaves on an abort, before it exits."""
        ...


class EpisodeFeed:
    """Read the run's latest hang episode from the store; say when the action aborted it."""

    def __init__(self, store: Store, identity: Identity, watcher: _Aborted | None = None) -> None:
        keys = for_run(identity.run, identity.attempt)
        self._channel = Channel(store, keys, identity.world_size)
        self._watcher = watcher
        self._seen = 0
        self._latest: Episode | None = None
        self._nodes: dict[int, str] = {}

    def latest(self) -> Episode | None:
        """Return the run's latest episode in this attempt (one store round trip)."""
        number = self._channel.episode()
        if number > self._seen:
            request = self._channel.request()
            if request.episode == number:
                self._seen = number
                culprit = request.behind[0] if request.behind else None
                node = self.node_of(culprit) if culprit is not None else ""
                onset = request.requested_unix - request.age
                self._latest = Episode(number, onset, culprit, node)
        return self._latest

    def aborted(self) -> float | None:
        """Return when the hang action decided to end the run (Unix time), None before."""
        found = self._watcher.aborted if self._watcher is not None else None
        return found[0] if found is not None else None

    def node_of(self, rank: int) -> str:
        """Return the node ``rank`` said it runs on in its ack ("" when it never said)."""
        if rank not in self._nodes:
            (ack,) = self._channel.acks([rank])
            if not ack.node:
                return ""
            self._nodes[rank] = ack.node
        return self._nodes[rank]


class _Rank(Protocol):
    """What :func:`start_goodput` reads of the instrumented rank (the observer)."""

    @property
    def heartbeat(self) -> object | None:
        """Return the rank's store heartbeat, None when it has none."""
        ...

    @property
    def hangs(self) -> _Aborted | None:
        """Return the rank's hang watcher, None when it has none."""
        ...

    recorder: Recorder
    errors: ErrorCounter
    end: End


def start_goodput(
    rank: _Rank,
    identity: Identity,
    endpoint: Endpoint,
    store: Store | None,
    dump_dir: str,
    start_step: int | None,
) -> GoodputTracker | None:
    """Start the rank's goodput account beside its heartbeat (None without one); never raises.

    Every rank publishes its work; the monitoring rank keeps the account, reading the hang
    watcher's episodes when it runs one. A clean end (``rank.end`` marked) ends the account, and
    so does the hang action's abort, before the rank exits.
    """
    if rank.heartbeat is None or store is None:
        return None
    monitor = identity.rank == endpoint.monitor_rank
    try:
        watcher = rank.hangs
        feed = EpisodeFeed(store, identity, watcher) if watcher is not None and monitor else None
        tracker = GoodputTracker(
            identity,
            store,
            recorder=rank.recorder,
            sections=REGISTRY,
            interval_s=endpoint.heartbeat_s,
            monitor=monitor,
            dump_dir=dump_dir,
            errors=rank.errors,
            start_step=start_step,
            hangs=feed,
            end=rank.end,
        )
        if watcher is not None and monitor:
            # The account ends at the abort and is on disk before the exit (the next attempt
            # carries it on); the final scrapes the abort waits for read its last totals.
            watcher.when_aborting(lambda: tracker.finish(clean=False))
        return tracker.start()
    except Exception as exc:  # noqa: BLE001 - the account must never stop training
        rank.errors.record("goodput", exc)
        return None
