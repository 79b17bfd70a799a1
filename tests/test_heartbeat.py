"""Heartbeats through a real c10d store, and the bound on what the monitoring rank publishes."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from exporter.errors import ErrorCounter
from exporter.sources.heartbeat import LATE_AFTER_INTERVALS, Heartbeat
from exporter.storekeys import for_run

pytestmark = pytest.mark.unit

KEYS = for_run("r")


def heartbeat_key(run: str, rank: int) -> str:
    """Return the counter key of ``rank`` (run "r", attempt 0)."""
    assert run == "r"
    return KEYS.heartbeat(rank)


INTERVAL = 1.0


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store() -> dist.Store:
    return dist.HashStore()


def _monitor(store: dist.Store, clock: Clock, world: int, peer_series: int) -> Heartbeat:
    """Return a monitoring rank's Heartbeat driven by the test: no background thread."""
    hb = Heartbeat(
        store,
        KEYS,
        0,
        world,
        INTERVAL,
        monitor=True,
        errors=ErrorCounter(),
        clock=clock,
        peer_series=peer_series,
    )
    for peer in range(world):
        store.add(heartbeat_key("r", peer), 1)
    hb.poll()
    return hb


def _advance(store: dist.Store, clock: Clock, hb: Heartbeat, seconds: float, alive) -> None:
    """Let ``seconds`` pass in one-interval polls; the peers in ``alive`` beat each interval."""
    for _ in range(int(seconds / INTERVAL)):
        clock.now += INTERVAL
        for peer in alive:
            store.add(heartbeat_key("r", peer), 1)
        hb.poll()


def test_every_peer_is_published_up_to_the_limit(store):
    clock = Clock()
    hb = _monitor(store, clock, world=4, peer_series=4)
    _advance(store, clock, hb, 10, alive=[0, 1, 3])
    published = dict(hb.published_ages())
    assert sorted(published) == [0, 1, 2, 3]
    assert published[2] == pytest.approx(10.0)
    assert published[0] == pytest.approx(0.0)


def test_beyond_the_limit_only_late_peers_are_published_oldest_first(store):
    clock = Clock()
    hb = _monitor(store, clock, world=16, peer_series=2)
    _advance(store, clock, hb, 5, alive=[p for p in range(16) if p not in (3, 7, 11)])
    _advance(store, clock, hb, 5, alive=[p for p in range(16) if p not in (3, 11)])
    # Peer 7 beat again and is live; 3 and 11 have been silent for 10 intervals.
    assert hb.published_ages() == [(3, pytest.approx(10.0)), (11, pytest.approx(10.0))]
    _advance(store, clock, hb, 2, alive=[p for p in range(16) if p not in (3, 5, 11)])
    # Peer 5 has been silent for two intervals only: not late yet.
    assert [p for p, _ in hb.published_ages()] == [3, 11]
    _advance(store, clock, hb, (LATE_AFTER_INTERVALS + 1) * INTERVAL, alive=[0])
    # Now peers 1..15 are all late; the two oldest, 3 and 11, are published, no more.
    assert [p for p, _ in hb.published_ages()] == [3, 11]


def test_a_limit_of_zero_publishes_no_peer(store):
    clock = Clock()
    hb = _monitor(store, clock, world=3, peer_series=0)
    _advance(store, clock, hb, 10, alive=[])
    assert hb.peer_ages() == [pytest.approx(10.0)] * 3
    assert hb.published_ages() == []


def test_a_peer_that_ended_cleanly_is_not_published_as_late(store):
    clock = Clock()
    hb = _monitor(store, clock, world=3, peer_series=64)
    peer = Heartbeat(store, KEYS, 2, 3, INTERVAL, monitor=False, errors=ErrorCounter())
    peer.finish()  # rank 2 closed the exporter at the end of its training
    _advance(store, clock, hb, 10 * INTERVAL, alive=[0, 1])
    assert hb.finished_peers() == {2}
    assert sorted(dict(hb.published_ages())) == [0, 1]


def test_a_rank_instrumented_again_after_a_clean_end_is_not_finished(store):
    clock = Clock()
    first = Heartbeat(store, KEYS, 1, 2, INTERVAL, monitor=False, errors=ErrorCounter())
    first.finish()
    again = Heartbeat(store, KEYS, 1, 2, INTERVAL, monitor=False, errors=ErrorCounter())
    again.start()
    try:
        hb = _monitor(store, clock, world=2, peer_series=64)
        assert hb.finished_peers() == frozenset()
    finally:
        again.close()


def test_a_loop_asked_to_wait_past_the_platform_limit_keeps_running(monkeypatch):
    """A wait longer than the platform allows raised in the loop's thread and ended it for good
    (an out-of-range heartbeat took the heartbeat, goodput and forensics threads with it)."""
    import threading

    from exporter.background import BackgroundLoop

    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    ticked = threading.Event()

    def tick() -> float:
        ticked.set()
        return 1e12  # seconds: past threading.TIMEOUT_MAX

    loop = BackgroundLoop("test-long-wait", tick, 1.0, errors=ErrorCounter(), where="test")
    loop._first_wait = 0.0
    loop.start()
    assert ticked.wait(10)
    loop.close(timeout=10)
    assert not loop.alive() and died == []
