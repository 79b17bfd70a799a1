"""The run-time reach probe of a hang with nobody behind, and the collectives a verdict names.

Real sockets on this host for the probe's listener and attempts; the judgement of who failed
against whom on made-up rounds; three watchers in this process over one store (the protocol's
own test harness) with the attempts between two nodes made to fail, from the probe to an early
symmetric episode, its verdict, its series and the abort that names the nodes; a deadlock
across two process groups with every link fine; and one two-buckets-in-flight hang said the
same way by the verdict, ``top`` and the dump. The real faults (nftables, namespaces) are the
lab's (tests/test_lab_probe.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from harness import wait_for
from test_hang_protocol import _context, _InFlight, _Store

from exporter import storekeys
from exporter.errors import ErrorCounter
from exporter.hangs import codec, probing, spans
from exporter.hangs import verdict as verdicts
from exporter.hangs.action import ActionPolicy
from exporter.hangs.channel import Channel
from exporter.hangs.definition import HangFinding, HangPolicy, SeqState, find_hangs
from exporter.hangs.dumps import render_dump
from exporter.hangs.protocol import (
    DumpRequest,
    Episode,
    Frame,
    InflightOp,
    Network,
    PeerReach,
    PgSeqs,
    ProbeRequest,
    ProbeResult,
    RankDump,
    RankState,
    Summary,
)
from exporter.hangs.watcher import HangWatcher
from exporter.network import judge as network
from exporter.network.probe import Listener, reach, reach_all
from exporter.sources import ras
from exporter.sources.flight import PGState
from exporter.tools.top import diagnose
from exporter.tools.top.rows import RankRow

pytestmark = pytest.mark.unit


# -- the probe's listener and attempts, over real sockets ---------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_listener_echoes_and_an_attempt_says_how_it_ended():
    errors = ErrorCounter()
    listener = Listener("127.0.0.1", errors)
    try:
        # Listening, not yet serving: the kernel accepts, nobody echoes: stalled, not dropped.
        assert reach(listener.address, connect_s=1.0, move_s=0.5).kind == "stalled"
        listener.serve()
        found = reach_all({1: listener.address, 2: listener.address})
        assert {r: f.kind for r, f in found.items()} == {1: "ok", 2: "ok"}
        assert all(f.seconds < 1.0 for f in found.values())
        # Nothing listens there: refused, retried until the deadline.
        assert reach(f"127.0.0.1:{_free_port()}", connect_s=0.5).kind == "refused"
        assert reach("no-such-host.invalid:1", connect_s=0.5).kind == "unresolved"
        # A stranger's bytes get no echo and do not stop the listener.
        with socket.create_connection(_split(listener.address), timeout=2) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            s.settimeout(2)
            assert s.recv(10) == b""
        assert reach(listener.address).kind == "ok"
    finally:
        listener.close()
    assert not any(errors.snapshot().values()), errors.snapshot()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# -- who failed against whom ---------------------------------------------------------------------
NODES3 = {0: "n0", 1: "n1", 2: "n2"}


def _round(
    failed: dict[int, dict[int, str]],
    nodes: dict[int, str] = NODES3,
    answered: set[int] | None = None,
):
    """Judge one made-up round among ``nodes`` where ``failed[rank][peer]`` says how it failed."""
    peers, plan = network.plan(nodes, {r: f"10.0.0.{r}:1" for r in nodes})
    request = ProbeRequest(1, "0", 36.0, peers, plan)
    results = {
        r: ProbeResult(
            1, r, {p: PeerReach(failed.get(r, {}).get(p, "ok"), 0.001 * (p + 1)) for p in plan[r]}
        )
        if answered is None or r in answered
        else None
        for r in plan
    }
    return network.judge(request, results, nodes)


def test_a_dropped_pair_is_a_link_and_no_node_is_blamed():
    found = _round({1: {2: "dropped"}, 2: {1: "dropped"}})
    assert [(f.a, f.b, f.how) for f in found.links] == [("n1", "n2", "dropped")]
    assert found.down == () and found.faulty
    assert network.blamed_nodes(found) == ["n1", "n2"]
    assert network.series(found) == [("link", "n1", "n2")]
    assert network.lines(found)[0] == (
        "link between node n1 and node n2: connections time out (dropped); both reach their "
        "other peers"
    )


def test_a_node_nobody_reaches_is_down_and_its_victims_are_not_blamed():
    found = _round({0: {2: "dropped"}, 1: {2: "dropped"}, 2: {0: "dropped", 1: "dropped"}})
    assert [(f.node, f.how, f.tried_by) for f in found.down] == [("n2", "dropped", 2)]
    assert found.links == ()
    assert network.series(found) == [("node", "n2", "")]
    assert network.lines(found)[0].startswith(
        "node n2: unreachable from every peer on its backend address: connections time out"
    )


def test_two_nodes_cannot_tell_the_node_from_the_link():
    found = _round({0: {1: "dropped"}, 1: {0: "dropped"}}, {0: "n0", 1: "n1"})
    assert found.down == () and [(f.a, f.b) for f in found.links] == [("n0", "n1")]
    assert "two nodes: nothing tells which end is broken" in network.lines(found)[0]


def test_every_pair_answering_is_not_the_network_and_a_silent_node_is_no_verdict():
    clear = _round({})
    assert not clear.faulty and network.series(clear) == [("clear", "", "")]
    assert network.lines(clear)[0].startswith("every pair of the 3 nodes reachable and moving data")
    assert clear.slowest is not None and clear.median_s is not None
    silent = _round({}, answered={0, 1})
    assert silent.silent == ("n2",) and not silent.faulty and network.series(silent) == []
    # A fault must hold in the confirming round too.
    first = _round({1: {2: "dropped"}, 2: {1: "dropped"}})
    assert not network.confirm(first, clear).faulty
    assert network.confirm(first, first).links == first.links


def test_every_rank_stuck_answering_and_nobody_behind_is_what_starts_a_probe():
    stuck = [SeqState(r, "0", 36, 12.0) for r in range(3)]
    findings = find_hangs(stuck)
    assert probing.all_stuck(stuck, findings, 10.0, {0, 1, 2}) == ("0", 36)
    assert probing.all_stuck(stuck, findings, 10.0, {0, 1}) is None  # a silent rank
    assert probing.all_stuck(stuck, findings, 15.0, {0, 1, 2}) is None  # not long enough
    behind = [*stuck[:2], SeqState(2, "0", 35, 0.0)]
    assert probing.all_stuck(behind, find_hangs(behind), 10.0, {0, 1, 2}) is None
    section = [*stuck[:2], SeqState(2, "0", 36, 12.0, in_section=True)]
    assert probing.all_stuck(section, find_hangs(section), 10.0, {0, 1, 2}) is None
    # Two groups entered in opposite orders: each rank waits in one, every rank is stuck.
    crossed = [
        SeqState(0, "1", 5, 12.0),
        SeqState(1, "1", 4, 0.0),
        SeqState(0, "2", 4, 0.0),
        SeqState(1, "2", 5, 12.0),
    ]
    found = find_hangs(crossed)
    assert [f.kind for f in found] == ["waiting", "waiting"]
    assert probing.all_stuck(crossed, found, 10.0, {0, 1}) == ("1", 5)
    # ... and, once past the symmetric threshold, the hang is symmetric in both groups.
    late = [SeqState(s.rank, s.pg, s.last_enqueued, s.inflight_age and 70.0) for s in crossed]
    assert [f.kind for f in find_hangs(late)] == ["symmetric", "symmetric"]


# -- three watchers, one store: the probe decides ------------------------------------------------
class _AllInside:
    """Every rank inside collective 36 (35 completed) since ``since``."""

    name = "hook"

    def __init__(self, since: float) -> None:
        self.since = since

    def read(self) -> list[PGState]:
        return [PGState("0", 36, 35, time.monotonic() - self.since, 1800.0)]


def _watchers(tmp_path, inflight, *, action: ActionPolicy | None = None, exits=None):
    store, watchers = _Store(), []
    policy = HangPolicy(stall_min_seconds=0.5, symmetric_min_seconds=30.0)
    for rank in range(3):
        w = HangWatcher(
            _context(store, rank, "probe", f"n{rank}", tmp_path, local_rank=0),
            inflight=inflight(rank),
            policy=policy,
            action=action,
            forget=lambda: None,
            probe=True,
        )
        if action is not None:
            leaving = w._rank._leaving
            leaving._exit = lambda code, r=rank, w=w: (exits.__setitem__(r, code), w._loop.stop())
            leaving._quiet = lambda: None
        watchers.append(w)
    return store, watchers


@pytest.fixture
def cut_n1_n2(monkeypatch):
    """Node n1 and node n2 cannot reach each other (their listeners are rank 1's and 2's)."""
    real, real_try, me = probing.reach_all, probing.Answering._try, threading.local()

    def cut(targets, *args):
        found = real(targets, *args)
        return {
            p: PeerReach("dropped", 3.0) if {p, me.rank} == {1, 2} else f for p, f in found.items()
        }

    def tagged(self, number, targets):
        me.rank = self._site.rank  # the attempts run on this thread
        real_try(self, number, targets)

    monkeypatch.setattr(probing, "reach_all", cut)
    monkeypatch.setattr(probing.Answering, "_try", tagged)


def test_a_link_that_drops_between_two_nodes_is_named_early_and_the_abort_names_it(
    tmp_path, cut_n1_n2
):
    exits: dict[int, int] = {}
    since = time.monotonic()
    store, watchers = _watchers(
        tmp_path,
        lambda r: _AllInside(since),
        action=ActionPolicy(after_s=1.0, publish_s=0.2),
        exits=exits,
    )
    try:
        for w in watchers:
            w.start()
        verdict_file = wait_for(
            lambda: list(tmp_path.glob("probe-hang-1/verdict.txt")),
            20,
            "the early episode's verdict",
        )[0]
        took = time.monotonic() - since
        text = verdict_file.read_text()
        assert watchers[0].network == (("link", "n1", "n2"),)
        wait_for(lambda: len(exits) == 3, 30, "every rank to leave")
    finally:
        for w in watchers:
            w.close()
    assert took < 30.0  # long before the symmetric threshold
    assert "symmetric hang in pg 0 at collective #36" in text, text
    assert (
        "link between node n1 and node n2: connections time out (dropped); both reach "
        "their other peers; every rank is stuck in collective #36 (pg 0)"
    ) in text, text
    assert "NETWORK (probed between the nodes while every rank waited):" in text
    episode = codec.episode_from_dict(
        json.loads(verdict_file.with_name("episode.json").read_text())
    )
    assert episode.network is not None and episode.network.links[0].a == "n1"
    action = episode.action
    assert action is not None and action.culprits == () and action.nodes == ("n1", "n2")
    assert "carries no traffic (dropped)" in (action.network or "")
    (line,) = tmp_path.glob("probe-abort.txt")
    assert "culprit_nodes=n1,n2" in line.read_text(), line.read_text()


class _Staggered:
    """A link broke during collective #47: rank 0 completed it and waits in #48, ranks 1 and 2
    never complete #47 (a ring all-reduce ends on one rank before the others)."""

    name = "hook"

    def __init__(self, rank: int, since: float) -> None:
        self.rank, self.since = rank, since

    def read(self) -> list[PGState]:
        age = time.monotonic() - self.since
        return [
            PGState("0", 48, 47, age, 1800.0)
            if self.rank == 0
            else PGState("0", 47, 46, age, 1800.0)
        ]


def test_ranks_stuck_in_a_collective_another_rank_completed_are_not_behind(tmp_path, cut_n1_n2):
    """A collective one rank completed is over for all only for a moment: ranks whose fresh
    reports keep showing it in flight are stuck in it (the broken link), not behind."""
    since = time.monotonic()
    store, watchers = _watchers(tmp_path, lambda r: _Staggered(r, since))
    try:
        for w in reversed(watchers):  # every rank reports on its own before the monitor reads
            w.start()
        text = wait_for(
            lambda: [p.read_text() for p in tmp_path.glob("probe-hang-1/verdict.txt")],
            20,
            "the verdict",
        )[0]
    finally:
        for w in watchers:
            w.close()
    assert "symmetric hang in pg 0" in text and "is behind" not in text, text
    assert "never entered" not in text, text
    assert "link between node n1 and node n2" in text, text


def test_a_rank_whose_report_predates_a_completion_is_behind_only_once_it_had_time_to_report(
    tmp_path, monkeypatch
):
    """A monitor that first reads a job long stuck in #47 (rank 0 completed it) must not call
    a rank behind before its next report could show it inside #47; a rank silent past that is."""
    since = time.monotonic() - 5.0  # stuck well past the stall threshold already
    store, watchers = _watchers(tmp_path, lambda r: _Staggered(r, since))
    channel = Channel(store, storekeys.for_run("probe"), 3)  # what the ranks read
    clock = [time.monotonic()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # the monitor's reads, by hand
    try:
        for w in watchers:
            w._rank.start()  # every first report, then no loop: the reports move when told
        monitor = watchers[0]._monitor
        monitor.watch()  # the first read: #47's completion is seen now
        for tick in (1, 2):
            clock[0] += 0.1
            watchers[0]._rank.publish(tick)
            watchers[1]._rank.publish(tick)  # rank 1 shows it is inside #47; rank 2 lags
            monitor.watch()
        assert channel.episode() == 0, "a rank was called behind on a report older than #47's end"
        clock[0] += 0.3  # rank 2 silent for more than two intervals: it may be frozen
        watchers[0]._rank.publish(3)
        watchers[1]._rank.publish(3)
        monitor.watch()
        assert channel.episode() == 1
        request = channel.request()
        assert (request.kind, tuple(request.behind)) == ("behind", (2,)), request
    finally:
        monkeypatch.undo()
        for w in watchers:
            w.close()


class _Crossed:
    """Ranks 0 and 2 wait in pg 1 #5, rank 1 in pg 2 #5: collectives entered in opposite orders."""

    name = "hook"

    def __init__(self, rank: int, since: float) -> None:
        self.rank, self.since = rank, since

    def read(self) -> list[PGState]:
        age = time.monotonic() - self.since
        mine, other = ("1", "2") if self.rank != 1 else ("2", "1")
        return [PGState(mine, 5, 4, age, 1800.0), PGState(other, 4, 4, 0.0, 1800.0)]


def test_a_deadlock_across_two_groups_is_not_the_network(tmp_path, monkeypatch):
    monkeypatch.setattr(HangPolicy, "symmetric_seconds", lambda self, lat, tmo: 3.0)
    since = time.monotonic()
    store, watchers = _watchers(tmp_path, lambda r: _Crossed(r, since))
    try:
        for w in watchers:
            w.start()
        verdict_file = wait_for(
            lambda: list(tmp_path.glob("probe-hang-1/verdict.txt")),
            30,
            "the symmetric episode's verdict",
        )[0]
        assert watchers[0].network == (("clear", "", ""),), verdict_file.read_text()
    finally:
        for w in watchers:
            w.close()
    text = verdict_file.read_text()
    assert "symmetric hang in pg 1" in text, text
    assert "every pair of the 3 nodes reachable and moving data" in text, text
    assert "not the network; fix the order of the collectives" in text, text
    assert "node n" not in text.split("NETWORK")[0].split("CULPRITS:")[1], text


# -- the first collective a rank missed: verdict, top and the dump agree -------------------------
def _summary(rank: int, last_enqueued: int, last_completed: int, inflight: list[int]) -> Summary:
    frame = Frame("/job/train.py", 40, "train_step")
    return Summary(
        rank,
        9,
        "collective",
        (frame,),
        frame,
        tuple(InflightOp("all_reduce", s, "0") for s in inflight),
        {"0": PgSeqs(last_enqueued, last_completed)},
    )


def test_two_buckets_in_flight_name_the_first_collective_missed_everywhere():
    # Ranks 0 and 2 entered #699 and #700 (two DDP buckets) and wait in #699; rank 1 last
    # entered #698: the first collective it missed is #699.
    summaries = {
        0: _summary(0, 700, 698, [699, 700]),
        1: _summary(1, 698, 698, []),
        2: _summary(2, 700, 698, [699, 700]),
    }
    episode = codec.episode_from_dict(
        {
            "episode": 1,
            "run": "r",
            "pg": "0",
            "kind": "behind",
            "seq": 700,
            "behind": [1],
            "waiting": [0, 2],
            "age": 12.0,
            "threshold": 10.0,
            "world_size": 3,
            "last_enqueued": {"0": 700, "1": 698, "2": 700},
        }
    )
    text = verdicts.render(verdicts.verdict(episode, summaries))
    assert "a rank is behind in pg 0 at all_reduce #699 (#700 queued behind it)" in text, text
    assert "rank 1 never entered all_reduce #699–#700 (pg 0)" in text, text
    assert "rank 0,2 wait in all_reduce #699, #700 queued behind it (pg 0)" in text, text
    # top, from the same ranks' series.
    rows = [
        RankRow(
            f"r{r}",
            rank=r,
            up=True,
            pg_seq={"0": float(e)},
            pg_done={"0": float(d)},
            pg_age={"0": a},
        )
        for r, e, d, a in ((0, 700, 698, 12.0), (1, 698, 698, 0.0), (2, 700, 698, 12.0))
    ]
    first = diagnose(rows)
    again = [
        RankRow(r.target, rank=r.rank, up=True, pg_seq=r.pg_seq, pg_done=r.pg_done, pg_age=r.pg_age)
        for r in rows
    ]
    verdict_of = {r.rank: r.verdict for r in diagnose(again, {r.target: r for r in first})}
    assert "never entered #699–#700" in verdict_of[1], verdict_of
    # The dumps: rank 1 last entered #698, rank 0 waits in #699 with #700 behind it.
    request = DumpRequest(1, "0", "behind", 700, (1,), (0, 2))

    def dump(rank: int, entered: int, done: int) -> str:
        state = RankState(0.0, (), (), {}, "collective", 9, {"0": PgSeqs(entered, done)})
        return render_dump(rank, RankDump(state, 1, "r", rank, 3, "h", "n", 1, request))

    assert "pg 0: nothing in flight; last entered #698" in dump(1, 698, 698)
    assert "pg 0: in flight #699, #700 queued behind it; last completed #698" in dump(0, 700, 698)


def test_a_symmetric_hang_names_the_collective_stuck_and_what_is_queued_behind_it():
    summaries = {r: _summary(r, 838, 836, [837, 838]) for r in range(4)}
    episode = codec.episode_from_dict(
        {
            "episode": 1,
            "run": "r",
            "pg": "0",
            "kind": "symmetric",
            "seq": 838,
            "behind": [],
            "waiting": [0, 1, 2, 3],
            "age": 70.0,
            "threshold": 60.0,
            "world_size": 4,
        }
    )
    v = verdicts.verdict(episode, summaries)
    assert "symmetric hang in pg 0 at all_reduce #837 (#838 queued behind it)" in v.header
    assert v.culprits[0] == (
        "no rank is behind: every rank is stuck in all_reduce #837, #838 "
        "queued behind it (pg 0) and none completes"
    )
    assert v.waiting[0].startswith("rank 0-3 wait in all_reduce #837, #838 queued behind it")
    assert spans.missed(None, 5) == "#5" and spans.stuck(None, 5) == "#5"


def test_a_symmetric_hang_on_one_node_suspects_the_device_whose_collective_never_started():
    """NCCL's start events: ranks 0, 1 and 3 started all_reduce #837 on the device, rank 2's is
    still scheduled behind its stream (a stalled GPU). On one node nothing was probed."""
    frame = Frame("/job/train.py", 40, "train_step")

    def summary(rank: int, state: str) -> Summary:
        op = InflightOp("all_reduce", 837, "0", "default_pg", state)
        return Summary(rank, 9, "data", (frame,), frame, (op,), {"0": PgSeqs(837, 836)})

    summaries = {r: summary(r, "scheduled" if r == 2 else "started") for r in range(4)}
    request = DumpRequest(1, "0", "symmetric", 837, (), (0, 1, 2, 3), 31.0, 30.0)
    note = Network("0", 837.0, 1.5, note="one node: no link between nodes to probe")
    v = verdicts.verdict(Episode(request, run="r", world_size=4, network=note), summaries)
    assert v.culprits == [
        "no rank is behind: every rank is stuck in all_reduce #837 (pg 0) and none completes",
        "one node: no link between nodes to probe; suspect the device of rank 2: its collective "
        "never started while the others' did",
    ]
    # Without start events (timing off) every entry stays scheduled: no device is suspected.
    summaries = {r: summary(r, "scheduled") for r in range(4)}
    v = verdicts.verdict(Episode(request, run="r", world_size=4, network=note), summaries)
    assert v.culprits[1].endswith("suspect a rank's device or the backend"), v.culprits


# -- NCCL's RAS, where it answers -----------------------------------------------------------------
#: A RAS report naming a dead peer (the shape of ``ncclras``'s output).
_RAS_REPORT = (
    "RAS status\n==========\nJob summary\n  Nodes 2 Processes 2\nErrors\n======\n"
    "  #1 process unresponsive: rank 1 on node n1 (dead peer)\n"
)


@pytest.fixture
def ras_standin():
    """A socket that answers NCCL's RAS client protocol with :data:`_RAS_REPORT` (NCCL's RAS
    cannot run without NCCL); yields its address."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed: the test is over
            with conn, conn.makefile("rwb") as f:
                assert f.readline().startswith(b"CLIENT PROTOCOL")
                f.write(b"SERVER PROTOCOL 2\n")
                f.flush()
                assert f.readline().startswith(b"TIMEOUT")
                f.write(b"OK\n")
                f.flush()
                assert f.readline() == b"STATUS\n"
                f.write(_RAS_REPORT.encode())
                f.flush()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        yield server.getsockname()
    finally:
        server.close()
        t.join(timeout=5)


def test_ras_lines_come_from_ncclras_protocol_and_none_without_it(ras_standin):
    lines = ras.query(ras_standin, seconds=5.0)
    assert lines == ("#1 process unresponsive: rank 1 on node n1 (dead peer)",)
    assert ras.query(("127.0.0.1", _free_port()), seconds=1.0) == ()
    assert ras.ras_address({"NCCL_RAS_ENABLE": "0"}) is None
    assert ras.ras_address({"NCCL_RAS_ADDR": "10.0.0.1:1234"}) == ("10.0.0.1", 1234)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_an_nccl_episode_on_one_node_quotes_ras_and_a_gloo_one_does_not_ask(
    tmp_path, monkeypatch, ras_standin, backend
):
    """RAS is asked as the episode opens, whatever its kind and however many nodes: here rank 1
    is behind on a job of one node, where no link is probed."""
    monkeypatch.setenv("NCCL_RAS_ADDR", f"{ras_standin[0]}:{ras_standin[1]}")
    store, since = _Store(), time.monotonic()
    watchers = []
    for rank in range(3):
        ctx = _context(store, rank, "ras", "n0", tmp_path)
        policy = HangPolicy(stall_min_seconds=0.4, symmetric_min_seconds=30.0)
        inflight = _InFlight(rank, since)
        watchers.append(
            HangWatcher(ctx, inflight=inflight, policy=policy, forget=lambda: None, backend=backend)
        )
    try:
        for w in watchers:
            w.start()
        verdict_file = wait_for(
            lambda: list(tmp_path.glob("ras-hang-1/verdict.txt")), 30, "the verdict"
        )[0]
    finally:
        for w in watchers:
            w.close()
    text = verdict_file.read_text()
    episode = codec.episode_from_dict(
        json.loads(verdict_file.with_name("episode.json").read_text())
    )
    assert "rank 1 (node n0) never entered collective #36" in text, text
    dead = "#1 process unresponsive: rank 1 on node n1 (dead peer)"
    if backend == "nccl":
        assert episode.ras == (dead,)
        assert f"NCCL RAS (what NCCL's own monitor reported as wrong):\n  {dead}\n" in text, text
    else:
        assert episode.ras == () and "NCCL RAS" not in text, text


def test_the_probe_messages_travel_through_the_codec_unchanged():
    request = ProbeRequest(
        2, "0", 36.0, {0: "10.0.0.1:5", 3: "10.0.0.2:6"}, {0: (3,), 3: (0,)}, 6.0, 1.5
    )
    assert codec.decode_probe_request(codec.encode_probe_request(request)) == request
    result = ProbeResult(2, 3, {0: PeerReach("dropped", 3.0)})
    assert codec.decode_probe_result(codec.encode_probe_result(result)) == result
    found = _round({1: {2: "dropped"}, 2: {1: "dropped"}})
    assert codec.from_dict(Network, codec.to_dict(found)) == found
    assert HangFinding  # the definition's type is what the monitor opens early episodes with


def test_top_says_what_the_probe_found_beside_stuck():
    def rows() -> list[RankRow]:
        out = [
            RankRow(
                f"r{r}",
                rank=r,
                up=True,
                node=f"n{r}",
                pg_seq={"0": 838.0},
                pg_done={"0": 836.0},
                pg_age={"0": 75.0},
            )
            for r in range(3)
        ]
        out[0].network = [("link", "n1", "n2")]
        return out

    first = diagnose(rows())
    verdict_of = {r.rank: r.verdict for r in diagnose(rows(), {r.target: r for r in first})}
    assert verdict_of[2] == (
        "STUCK: inside collective #837 of pg 0 (#838 queued behind it) for 75 s, no rank "
        "behind; probe: the link between node n1 and node n2 carries no traffic"
    ), verdict_of
