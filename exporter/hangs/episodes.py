"""Tell the goodput account of the run's hang episodes: their onset, culprit and the abort.

The goodput account (:mod:`exporter.sources.goodput`, started by :mod:`exporter.assembly`)
reads the episodes on its monitoring rank through an :class:`EpisodeFeed`.

The monitoring rank's hang watcher opens an episode by bumping a counter in the store and
setting its request (:mod:`exporter.hangs.monitor`); the account (:mod:`exporter.sources.goodput`)
reads the latest one from the store here, on its own thread, and the abort from the watcher.
The onset is the stalled collective's start as the watcher measured it (the request's time less
the age it had then); the culprit's node is what the culprit said in its first ack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..settings import Identity
from ..sources.goodput import Episode
from ..storekeys import for_run
from .channel import Channel, Store

__all__ = ["EpisodeFeed"]


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
