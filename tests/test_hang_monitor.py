"""What the monitoring rank takes for a hang at a job's edges: reports read moments apart, and
the end of a declared section that held the others up.

Three watchers in this process over one store (the protocol's own test harness), their reports
scripted and published by hand, the monitoring rank's clock moved by hand: each read is one
moment of a real job. The same edges in real jobs: tests/test_hang_action.py.
"""

from __future__ import annotations

import time

import pytest
from test_hang_probe import _watchers

from exporter import storekeys
from exporter.hangs.channel import Channel
from exporter.sources.flight import PGState

pytestmark = pytest.mark.unit


class _Scripted:
    """Whatever the test last set for this rank (``states[rank]``: one group's, or a list)."""

    name = "hook"

    def __init__(self, rank: int, states: dict[int, PGState | list[PGState]]) -> None:
        self.rank, self.states = rank, states

    def read(self) -> list[PGState]:
        mine = self.states[self.rank]
        return list(mine) if isinstance(mine, list) else [mine]


class _Busy:
    """Rank 0's declared sections: one is open while ``open`` holds."""

    open = True

    def busy(self, now_mono: float | None = None, grace_s: float = 0.0) -> str | None:
        return "checkpoint" if self.open else None


def test_a_report_taken_before_a_completion_and_published_after_it_accuses_nobody(
    tmp_path, monkeypatch
):
    """Ranks 1 and 2 waited in #47 for rank 0's checkpoint. It ends, #47 completes, rank 0 goes
    on and rank 1 computes; rank 2's next report, taken before #47 ended and published after
    the monitor saw it end (a busy host), still shows it inside #47, past the threshold. Not a
    hang with rank 1 behind: rank 2's report after that shows #47 over."""
    states = {
        0: PGState("0", 46, 46, 0.0, 1800.0),
        1: PGState("0", 47, 46, 5.0, 1800.0),
        2: PGState("0", 47, 46, 5.0, 1800.0),
    }
    store, watchers = _watchers(tmp_path, lambda r: _Scripted(r, states))
    channel = Channel(store, storekeys.for_run("probe"), 3)
    section = watchers[0]._rank._sections = _Busy()
    clock = [time.monotonic()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    try:
        for w in watchers:
            w._rank.start()
        monitor = watchers[0]._monitor
        monitor.watch()  # rank 0 checkpoints, the others wait for it: excused
        section.open = False
        states[0] = PGState("0", 49, 48, 0.01, 1800.0)
        states[1] = PGState("0", 47, 47, 0.0, 1800.0)
        clock[0] += 0.1
        watchers[0]._rank.publish(1)
        watchers[1]._rank.publish(1)
        monitor.watch()  # #48's completion is seen now
        clock[0] += 0.1
        states[2] = PGState("0", 47, 46, 5.2, 1800.0)
        watchers[2]._rank.publish(1)  # taken before #47 ended
        monitor.watch()
        assert channel.episode() == 0, channel.request()
        clock[0] += 0.1
        states[2] = PGState("0", 48, 48, 0.0, 1800.0)
        for w in watchers:
            w._rank.publish(2)
        monitor.watch()
        assert channel.episode() == 0, channel.request()
    finally:
        monkeypatch.undo()
        for w in watchers:
            w.close()


class _Job:
    """Three watchers whose reports say what ``states`` holds; the monitor's clock by hand."""

    def __init__(self, tmp_path, monkeypatch, states: dict[int, PGState]) -> None:
        self.states = states
        store, self.watchers = _watchers(tmp_path, lambda r: _Scripted(r, states))
        self.channel = Channel(store, storekeys.for_run("probe"), 3)
        self.section = self.watchers[0]._rank._sections = _Busy()
        self.clock = [time.monotonic()]
        monkeypatch.setattr(time, "monotonic", lambda: self.clock[0])
        self.tick = 0
        for w in self.watchers:
            w._rank.start()

    def read(self, after: float, **ages: float) -> int:
        """Move the clock by ``after`` s and the named ranks' ages (``r1=0.3``) with it; every
        rank reports, the monitor reads. Return the episodes opened so far."""
        self.clock[0] += after
        for name, age in ages.items():
            rank = int(name[1:])
            self.states[rank] = PGState("0", self.states[rank].last_enqueued, 46, age, 1800.0)
        self.tick += 1
        for w in self.watchers:
            w._rank.publish(self.tick)
        self.watchers[0]._monitor.watch()
        return self.channel.episode()

    def close(self) -> None:
        for w in self.watchers:
            w.close()


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    """Start a :class:`_Job` on ``states``; closed, and the clock given back, at the end."""
    jobs: list[_Job] = []

    def start(states: dict[int, PGState | list[PGState]]) -> _Job:
        jobs.append(_Job(tmp_path, monkeypatch, states))
        return jobs[-1]

    yield start
    monkeypatch.undo()
    for job in jobs:
        job.close()


def test_the_wait_for_a_section_counts_from_its_end(scripted):
    """Ranks 1 and 2 waited 300 s in #47 for rank 0's declared checkpoint. Rank 0 then works
    0.4 s more (under the 0.5 s stall threshold) before it enters #47: no hang. Had it not
    come, it would be behind one stall threshold after its section ended, not at once."""
    states = {
        0: PGState("0", 46, 46, 0.0, 1800.0),
        1: PGState("0", 47, 46, 300.0, 1800.0),
        2: PGState("0", 47, 46, 300.0, 1800.0),
    }
    job = scripted(states)
    assert job.read(0.1, r1=300.1, r2=300.1) == 0  # excused: rank 0 checkpoints
    job.section.open = False
    assert job.read(0.1, r1=300.2, r2=300.2) == 0
    assert job.read(0.3, r1=300.5, r2=300.5) == 0  # 0.4 s since the section's end
    assert job.read(0.3, r1=300.8, r2=300.8) == 1  # 0.7 s: rank 0 never came
    request = job.channel.request()
    assert (request.kind, request.behind) == ("behind", (0,)), request
    assert request.age < 1.0, request  # counted from the section's end


def test_a_rank_behind_beside_a_section_is_named_during_it(scripted):
    """Rank 0 checkpoints (declared) while rank 2, outside any section, never enters #47 that
    rank 1 waits in: the section excuses rank 0 only."""
    states = {
        0: PGState("0", 46, 46, 0.0, 1800.0),
        1: PGState("0", 47, 46, 0.2, 1800.0),
        2: PGState("0", 46, 46, 0.0, 1800.0),
    }
    job = scripted(states)
    assert job.read(0.1, r1=0.3) == 0  # under the stall threshold
    assert job.read(0.3, r1=0.6) == 1
    request = job.channel.request()
    assert (request.kind, request.behind) == ("behind", (2,)), request


def test_a_group_held_up_by_a_rank_waiting_for_a_section_is_held_up_too(scripted):
    """Groups a = {0, 1} and b = {1, 2}. Rank 0 checkpoints (declared); rank 1 waits for it in
    a's #47 and so never enters b's #21, where rank 2 waits for rank 1: nobody is behind in b,
    and past the symmetric threshold (30 s here) b would be a symmetric hang. It is the same
    section's wait, and counts from its end like a's."""

    def a(enqueued: int, age: float) -> PGState:
        return PGState("a", enqueued, 46, age, 1800.0)

    def b(enqueued: int, age: float) -> PGState:
        return PGState("b", enqueued, 20, age, 1800.0)

    states = {0: a(46, 0.0), 1: [a(47, 40.0), b(20, 0.0)], 2: b(21, 40.0)}
    job = scripted(states)
    assert job.read(0.1) == 0
    states[1], states[2] = [a(47, 40.2), b(20, 0.0)], b(21, 40.2)
    assert job.read(0.1) == 0
    job.section.open = False
    states[1], states[2] = [a(47, 40.3), b(20, 0.0)], b(21, 40.3)
    assert job.read(0.1) == 0
    states[1], states[2] = [a(47, 41.0), b(20, 0.0)], b(21, 41.0)
    assert job.read(0.7) == 1  # rank 0 never came: behind in a, 0.8 s after the end
    request = job.channel.request()
    assert (request.pg, request.kind, request.behind) == ("a", "behind", (0,)), request
