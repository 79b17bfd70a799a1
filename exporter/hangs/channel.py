"""Carry the hang protocol between the ranks of one attempt, through the c10d store.

Never through collectives: they are what hangs. :class:`Channel` puts and reads the typed values
of :mod:`exporter.hangs.protocol` under the attempt's keys (:mod:`exporter.storekeys`), encoded
by :mod:`exporter.hangs.codec`; :class:`Site` says who this rank is to the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from ..errors import ErrorCounter
from ..storekeys import Keys
from . import codec
from .definition import HangPolicy
from .protocol import Ack, Action, DumpRequest, ProbeRequest, ProbeResult, Report

__all__ = ["Channel", "Site", "Store"]


class Store(Protocol):
    """What the hang protocol uses of a c10d store (``torch.distributed.Store``)."""

    def set(self, key: str, value: str) -> None:
        """Set ``key`` (an answer is not awaited)."""

    def get(self, key: str) -> bytes:
        """Return ``key``'s value, waiting for it up to the store's timeout."""
        ...

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key``; return its value."""
        ...

    def check(self, keys: list[str]) -> bool:
        """Say whether every one of ``keys`` is set."""
        ...

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Return the values of ``keys``, in one round trip."""
        ...

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        """Return once every one of ``keys`` is set; raise after ``timeout``."""


@dataclass(frozen=True)
class Site:
    """Who this rank is in the hang protocol, and what it shares with every role."""

    run: str
    attempt: str
    rank: int
    world_size: int
    local_rank: int
    #: The node this rank runs on (the hostname when not set).
    node: str
    #: The monitoring rank decides hangs and collects the dumps.
    monitor: bool
    #: Seconds between two full ticks (reports, requests).
    interval_s: float
    dump_dir: str
    policy: HangPolicy
    errors: ErrorCounter


class Channel:
    """The protocol's messages of one attempt: reports, requests, acks, probes and the action."""

    def __init__(self, store: Store, keys: Keys, world_size: int) -> None:
        self.store = store
        self.keys = keys
        self._episode = keys.episode()
        self._request = keys.request()
        self._action = keys.action()
        self._reports = [keys.report(r) for r in range(world_size)]
        self._acks = [keys.ack(r) for r in range(world_size)]
        self._probe = keys.probe()
        self._probe_request = keys.probe_request()
        self._probe_results = [keys.probe_result(r) for r in range(world_size)]

    # -- every rank --------------------------------------------------------------------------
    def put_report(self, rank: int, report: Report) -> None:
        """Publish ``rank``'s report."""
        self.store.set(self._reports[rank], codec.encode_report(report))

    def put_ack(self, rank: int, ack: Ack) -> None:
        """Publish ``rank``'s answer to the latest request."""
        self.store.set(self._acks[rank], codec.encode_ack(ack))

    def episode(self) -> int:
        """Return the number of the latest hang episode (0: none yet), in one round trip."""
        return int(self.store.add(self._episode, 0))

    def request(self) -> DumpRequest:
        """Return the latest dump request."""
        return codec.decode_request(self.store.get(self._request))

    def action_decided(self) -> bool:
        """Say whether the monitoring rank published an action."""
        return self.store.check([self._action])

    def action(self) -> Action:
        """Return the action the monitoring rank published."""
        return codec.decode_action(self.store.get(self._action))

    def put_probe_result(self, rank: int, result: ProbeResult) -> None:
        """Publish ``rank``'s answer to a probe round (round 0 at start: a placeholder)."""
        self.store.set(self._probe_results[rank], codec.encode_probe_result(result))

    def probe_round(self) -> int:
        """Return the number of the latest probe round (0: none yet), in one round trip."""
        return int(self.store.add(self._probe, 0))

    def probe_request(self) -> ProbeRequest:
        """Return the latest probe request."""
        return codec.decode_probe_request(self.store.get(self._probe_request))

    # -- the monitoring rank -----------------------------------------------------------------
    def all_published(self) -> bool:
        """Say whether every rank published its first report and ack (they do at start)."""
        return self.store.check(self._reports + self._acks)

    def raw_reports(self) -> list[bytes]:
        """Return every rank's report as it travels (unchanged bytes: a silent rank)."""
        return self.store.multi_get(self._reports)

    def acks(self, ranks: list[int]) -> list[Ack]:
        """Return the acks of ``ranks``, in one round trip."""
        return [codec.decode_ack(v) for v in self.store.multi_get([self._acks[r] for r in ranks])]

    def open_episode(self, request: DumpRequest) -> None:
        """Publish ``request``, then bump the episode counter to its number.

        In this order, a rank that sees the new number always finds its request. Only the
        monitoring rank writes either key.
        """
        self.store.set(self._request, codec.encode_request(request))
        self.store.add(self._episode, 1)

    def open_probe(self, request: ProbeRequest) -> None:
        """Publish a probe request, then bump the round counter to its number (as episodes)."""
        self.store.set(self._probe_request, codec.encode_probe_request(request))
        self.store.add(self._probe, 1)

    def probe_results(self, ranks: list[int]) -> list[ProbeResult]:
        """Return the probe results of ``ranks`` (every rank set one at start), in one trip."""
        raw = self.store.multi_get([self._probe_results[r] for r in ranks])
        return [codec.decode_probe_result(v) for v in raw]

    def put_action(self, action: Action) -> None:
        """Publish the action decided for an episode."""
        self.store.set(self._action, codec.encode_action(action))
