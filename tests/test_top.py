"""ddp-exporter top: its verdicts follow the alerts' definitions, on synthetic reads and on
real jobs read both from their endpoints and from a real Prometheus."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import time

import pytest
from harness import REPO, Job, TopReader, wait_for

import exporter.tools.top as top
from exporter.mixin.config import DEFAULT, FAST, duration_seconds
from exporter.tools.localstack import LocalStack, MissingBinaryError, find_binaries
from exporter.tools.top.diagnose import ENDPOINT_HOLD_S


def _row(rank, seq, age=0.0, compute=0.05, data=0.001, steps=100.0, up=True):
    r = top.RankRow(f"t{rank}", rank=rank, up=up)
    if up:
        r.steps, r.step_sum = steps, steps * (compute + data)
        r.phase_sum = {"compute": steps * compute, "data": steps * data}
        r.coll_sum, r.coll_count = 0.02 * steps, steps
        r.pg_seq, r.pg_age, r.pg_timeout = {"0": seq}, {"0": age}, {"0": 1800.0}
    return r


def _reads(*tables):
    """Diagnose consecutive reads 10 s apart; return each table's {rank: verdict}."""
    previous, out = None, []
    for i, rows in enumerate(tables):
        for r in rows:
            r.read_at = r.read_at or 10.0 * i
        rows = top.diagnose(rows, previous)
        previous = {r.target: r for r in rows}
        out.append({r.rank: r.verdict for r in rows})
    return out


@pytest.mark.unit
def test_sequence_lag_on_a_live_job_accuses_nobody():
    # The reads of issue 9: ranks read milliseconds apart differ by 1-2 collectives.
    a = [_row(0, 768), _row(1, 768), _row(2, 770, age=0.0203)]
    b = [_row(0, 879, age=0.0182, steps=110), _row(1, 878, steps=110), _row(2, 878, steps=110)]
    for table in _reads(a, b, a):
        assert not any(table.values()), table


@pytest.mark.unit
def test_hang_needs_an_age_past_the_stall_threshold_in_two_reads():
    stall = FAST.hang_policy.stall_seconds(0.02)
    below = [_row(0, 10, age=stall - 1), _row(1, 9), _row(2, 10, age=stall - 1)]
    above = [_row(0, 10, age=stall + 1), _row(1, 9), _row(2, 10, age=stall + 1)]
    first, second, third = _reads(below, above, above)
    assert not any(first.values()) and not any(second.values()), (first, second)
    assert third[1].startswith("HUNG") and "never entered #10" in third[1], third
    assert third[0] == third[2] == ""


@pytest.mark.unit
def test_a_straggler_is_named_by_compute_and_only_a_hang_replaces_it():
    slow = [_row(0, 5), _row(1, 5, compute=0.2), _row(2, 5)]
    later = [_row(0, 6, steps=200), _row(1, 6, compute=0.2, steps=200), _row(2, 6, steps=200)]
    first, second = _reads(slow, later)
    assert first == {0: "", 1: "", 2: ""}
    assert second[1].startswith("straggler: compute 200 ms") and not second[0] + second[2]
    # The straggler's peers waiting for it, past the stall threshold, do not overwrite it ...
    waiting = [
        _row(0, 7, age=60, steps=300),
        _row(1, 7, compute=0.2, steps=300),
        _row(2, 7, age=60, steps=300),
    ]
    # ... but a rank that never entered the collective the others wait in is HUNG.
    hung = [_row(0, 8, age=60), _row(1, 7, compute=0.2), _row(2, 8, age=60)]
    assert _reads(slow, later, waiting)[2][1].startswith("straggler")
    verdicts = _reads(slow, hung, hung)[2]
    assert verdicts[1].startswith("HUNG") and not verdicts[0] + verdicts[2], verdicts


@pytest.mark.unit
def test_in_a_run_of_two_ranks_the_slower_is_judged_against_the_faster():
    """Their median is their mean: a rank 2.9 times slower was only 1.49 times it."""
    two = [_row(0, 5, compute=0.042), _row(1, 5, compute=0.122)]
    later = [_row(0, 6, compute=0.042, steps=200), _row(1, 6, compute=0.122, steps=200)]
    verdicts = _reads(two, later)[1]
    assert verdicts[1].startswith("straggler: compute 122 ms vs the other rank's 42 ms"), verdicts
    assert verdicts[0] == ""
    even = [_row(0, 5, compute=0.1), _row(1, 5, compute=0.12)]
    later = [_row(0, 6, compute=0.1, steps=200), _row(1, 6, compute=0.12, steps=200)]
    assert _reads(even, later)[1] == {0: "", 1: ""}


@pytest.mark.unit
def test_a_rank_slow_in_compute_that_waits_for_a_later_rank_is_not_a_straggler():
    # A loaded rehearsal's FSDP2 slow-data drill: rank 2 waits 400 ms for data each step, the
    # other two wait for it; rank 0 (the monitoring rank, on a busy host) computes 171 ms, rank
    # 1 106 ms. Rank 0 waits for rank 2 like rank 1: only rank 2 holds the job up.
    def table(n):
        return [
            _row(0, n, compute=0.171, data=0.0005, steps=n),
            _row(1, n, compute=0.106, data=0.0005, steps=n),
            _row(2, n, compute=0.100, data=0.400, steps=n),
        ]

    *_, last = _reads(table(100), table(200), table(300))
    assert last[2].startswith("straggler: data 400 ms") and not last[0] + last[1], last
    # Without the later rank, the same compute holds the others up: named.
    alone = [_row(0, 9, compute=0.171), _row(1, 9, compute=0.106), _row(2, 9, compute=0.100)]
    later = [
        _row(0, 9, compute=0.171, steps=200),
        _row(1, 9, compute=0.106, steps=200),
        _row(2, 9, compute=0.100, steps=200),
    ]
    assert _reads(alone, later)[1][0].startswith("straggler: compute 171 ms"), _reads(alone, later)


@pytest.mark.unit
@pytest.mark.parametrize("rank_0_compute", [0.456, 0.480])
def test_a_data_straggler_whose_wait_its_peers_spend_in_compute_is_named(rank_0_compute):
    # The demo trainer's DDP slow-data drill on gloo, measured: the peers of rank 1, which
    # waits 403 ms a step for data, spend their wait for it inside their compute (456 ms) and
    # arrive with it; on a busy host rank 0 arrives a little later still.
    def table(n):
        return [
            _row(0, n, compute=rank_0_compute, data=0.0002, steps=n),
            _row(1, n, compute=0.054, data=0.403, steps=n),
            _row(2, n, compute=0.456, data=0.0002, steps=n),
        ]

    *_, last = _reads(table(100), table(200), table(300))
    assert last[1].startswith("straggler: data 403 ms") and not last[0] + last[2], last


@pytest.mark.unit
def test_a_straggler_read_from_the_endpoints_a_second_apart_holds_for_seconds_first():
    # A loaded rehearsal: a healthy FSDP2 rank's compute doubled in two reads a second apart.
    def read(at, steps):
        rows = [_row(0, 5, steps=steps), _row(1, 5, compute=0.125, steps=steps), _row(2, 5)]
        for r in rows:
            r.read_at = at
        rows[2].steps, rows[2].phase_sum = steps, {"compute": 0.06 * steps, "data": 0.0}
        return rows

    previous, named = None, []
    for i in range(8):
        rows = top.diagnose(read(1000.0 + i, 100.0 * (i + 1)), previous)
        previous = {r.target: r for r in rows}
        named.append(rows[1].verdict)
    held = int(ENDPOINT_HOLD_S)
    assert not any(named[:held]), named
    assert named[held].startswith("straggler: compute 125 ms"), named


def _judged_a_second_apart(paces):
    """Judge reads 1 s apart with top's history; ``paces``: each interval's compute per step
    by rank (10 steps an interval). Return each read's {rank: verdict}."""
    history, total, out = top.ReadHistory(), {}, []
    for i, pace in enumerate([{}, *paces]):  # the first read is the baseline
        for rank, compute in pace.items():
            total[rank] = total.get(rank, 0.0) + 10 * compute
        rows = []
        for rank in range(3):
            r = _row(rank, 5, steps=10.0 * i, compute=0.0)
            r.phase_sum = {"compute": total.get(rank, 0.0), "data": 0.0}
            r.read_at = 1000.0 + i
            rows.append(r)
        out.append({r.rank: r.verdict for r in history.judge(rows)})
    return out


@pytest.mark.unit
def test_a_peers_one_second_burst_does_not_hide_a_straggler_read_from_the_endpoints():
    # A loaded rehearsal: rank 2 straggled (140 ms vs 20 ms a step); one 1-s interval of the
    # monitoring rank's compute at 300 ms made rank 2 look like a rank waiting for it.
    paces = [{0: 0.02, 1: 0.02, 2: 0.14} for _ in range(14)]
    paces[8][0] = 0.30
    named = [t[2] for t in _judged_a_second_apart(paces)]
    held = 1 + int(ENDPOINT_HOLD_S)
    assert not any(named[:held]), named
    assert all(v.startswith("straggler: compute") for v in named[held:]), named


@pytest.mark.unit
def test_a_two_second_burst_on_a_healthy_rank_read_from_the_endpoints_names_nobody():
    # A loaded rehearsal: a healthy rank's compute doubled (125 ms vs 60) in two 1-s reads.
    paces = [{0: 0.06, 1: 0.06, 2: 0.06} for _ in range(14)]
    paces[8][1] = paces[9][1] = 0.125
    tables = _judged_a_second_apart(paces)
    assert not [v for t in tables for v in t.values() if v], tables


@pytest.mark.unit
def test_the_read_history_keeps_what_its_window_needs_and_no_more():
    history = top.ReadHistory(window_s=5.0)
    for i in range(20):
        rows = [_row(r, 5, steps=10.0 * (i + 1)) for r in range(3)]
        for r in rows:
            r.read_at = 1000.0 + i
        history.judge(rows)
        kept = [at for at, _ in history._reads]
        # The newest read a window old (the next read's baseline) and every later one.
        assert kept[0] <= 1000.0 + i - 5.0 or kept[0] == 1000.0, kept
        assert len(kept) <= 7, kept
    with pytest.raises(ValueError, match="window_s"):
        top.ReadHistory(window_s=-1.0)


def _windowed(rows, at, window_s=20.0):
    """Return ``rows`` as Prometheus reads them: increases over a window ending at ``at``."""
    for r in rows:
        r.window = {
            "ddp_steps_total": r.steps,
            "ddp_step_duration_seconds_sum": r.step_sum,
            **{f"ddp_step_phase_seconds_sum:{k}": v for k, v in r.phase_sum.items()},
        }
        r.read_at, r.window_s = at, window_s
    return rows


@pytest.mark.unit
def test_a_straggler_from_prometheus_must_hold_over_windows_that_do_not_overlap():
    """Reads of overlapping windows see one burst twice: only reads a window apart confirm."""

    def read(at, compute=0.1):
        return _windowed([_row(0, 5), _row(1, 5, compute=compute), _row(2, 5)], at)

    burst = _reads(read(100.0), read(102.0), read(110.0), read(118.0), read(121.0, 0.05))
    assert not any(v for table in burst for v in table.values()), burst
    lasting = _reads(read(100.0), read(110.0), read(120.0), read(122.0))
    assert [t[1] for t in lasting[:2]] == ["", ""], lasting
    assert all(t[1].startswith("straggler: compute 100 ms") for t in lasting[2:]), lasting
    assert not any(t[0] + t[2] for t in lasting), lasting


@pytest.mark.unit
def test_a_straggler_on_a_throttled_gpu_is_named_with_the_gpu_cause():
    def gpus(rows, clocks, reasons):
        for r, clock, why in zip(rows, clocks, reasons):
            r.gpu_index, r.gpu_clock, r.gpu_slowdown = str(r.rank), clock, list(why)
        return rows

    def read(steps, compute1, clocks, reasons):
        rows = [_row(0, 5, steps=steps), _row(1, 5, compute=compute1, steps=steps)]
        return gpus([*rows, _row(2, 5, steps=steps)], clocks, reasons)

    hot = (1.98e9, 1.1e9, 1.98e9), ((), ("hw_slowdown",), ())
    second = _reads(read(100, 0.2, *hot), read(200, 0.2, *hot))[1]
    assert second[1] == (
        "straggler: compute 200 ms vs median 50 ms; GPU 1 throttled: hw_slowdown, SM 1.10 GHz "
        "vs peers' 1.98 GHz"
    ), second
    # The same cap on every GPU is no cause of one rank's pace; a throttled GPU that keeps
    # pace is no straggler at all.
    capped = (1.6e9,) * 3, (("sw_power_cap",),) * 3
    second = _reads(read(100, 0.2, *capped), read(200, 0.2, *capped))[1]
    assert second[1] == "straggler: compute 200 ms vs median 50 ms", second
    assert not any(_reads(read(100, 0.05, *hot), read(200, 0.05, *hot))[1].values())


def _linked(rank, steps, rtt, comm=0.7, node=""):
    """A rank of a job slowed by a link: every rank waits ``comm`` s per step in the allreduce."""
    r = _row(rank, steps // 10, steps=steps)
    r.phase_sum["comm_wait"] = steps * comm
    r.store_rtt, r.node = rtt, node
    return r


@pytest.mark.unit
def test_a_slow_link_is_named_by_store_round_trip_and_only_while_the_job_waits():
    def read(steps, rtt2, comm=0.7, host_rtt=0.0002):
        return [
            _linked(0, steps, host_rtt, comm),
            _linked(1, steps, 0.0003, comm),
            _linked(2, steps, rtt2, comm, node="n2"),
            _linked(3, steps, 0.0003, comm),
        ]

    first, second = _reads(read(100, 0.09), read(200, 0.094))
    assert not any(first.values()), first
    assert second[2].startswith("straggler: link: store round trip 94 ms vs median 0.3 ms")
    assert second[2].endswith("of its node is slow (node n2)"), second
    assert not second[0] + second[1] + second[3]
    # Healthy: the store's own node answers fastest; one slow beat is not a verdict.
    assert not any(_reads(read(100, 0.0003, host_rtt=0.00005), read(200, 0.0004))[1].values())
    assert not any(_reads(read(100, 0.09), read(200, 0.0003))[1].values())
    # A busy link the job does not wait on (little exposed communication) is not blamed.
    assert not any(_reads(read(100, 0.09, comm=0.01), read(200, 0.09, comm=0.01))[1].values())


@pytest.mark.unit
def test_a_one_node_job_names_no_link_however_its_round_trips_differ():
    # Three ranks on one node: a busy host makes one rank's round trip to the store 16 ms
    # against 2 ms, twice in a row, while every rank waits on communication. No network lies
    # between them and the store: contention, not a link.
    def read(steps):
        return [_linked(r, steps, 0.016 if r == 2 else 0.002, node="vm") for r in range(3)]

    assert not any(_reads(read(100), read(200), read(300))[2].values())
    # The same round trips across nodes name the rank behind the link.
    spread = [_linked(r, 300, 0.016 if r == 2 else 0.002, node=f"n{r}") for r in range(3)]
    later = [_linked(r, 400, 0.016 if r == 2 else 0.002, node=f"n{r}") for r in range(3)]
    assert _reads(spread, later)[1][2].startswith("straggler: link"), _reads(spread, later)


@pytest.mark.unit
def test_a_slow_link_on_the_store_s_own_node_is_named_by_every_other_node_s_round_trips():
    def read(steps, nodes, comm=0.7):
        # Node n0 hosts the store: its rank's round trip stays local while the others' cross
        # its slow link.
        return [
            _linked(r, steps, 0.00006 if r == 0 else 0.05, comm, node=f"n{r}") for r in range(nodes)
        ]

    second = _reads(read(100, 3), read(200, 3))[1]
    assert second[0] == (
        "straggler: link: store round trip 0.1 ms here, median 50 ms from the other nodes: its "
        "node hosts the store and its network link is slow (node n0)"
    ), second
    assert not second[1] + second[2], second
    # Two nodes: either end's slow link inflates the other node's round trip alone.
    assert not any(_reads(read(100, 2), read(200, 2))[1].values())
    # The job does not wait on the network: nobody.
    assert not any(_reads(read(100, 3, comm=0.01), read(200, 3, comm=0.01))[1].values())


@pytest.mark.unit
def test_down_needs_two_failed_reads_and_survives_in_the_table():
    up = [_row(0, 1), _row(1, 1)]
    down = [_row(0, 1, steps=110), top.RankRow("t1", up=False)]
    first, second, third = _reads(up, down, [_row(0, 1, steps=120), top.RankRow("t1", up=False)])
    assert second[1] == "" and third[1].startswith("DOWN"), (second, third)
    rows = top.diagnose(
        [_row(0, 1), _row(2, 1), top.RankRow("t1", up=False)],
        {"t1": top.diagnose([top.RankRow("t1", rank=1, up=False)])[0]},
    )
    table = top.render(rows, worst=2)
    assert table.splitlines()[1].split()[0] == "1" and "1 more ranks" in table


def _monitor(rank, seq, world, ages, ended):
    """A monitoring rank's row: the ranks' heartbeat ages (its own too; ended ones left out)
    and how many ended."""
    r = _row(rank, seq)
    r.world_size, r.peer_ages, r.peers_ended = world, dict(ages), ended
    return r


@pytest.mark.unit
def test_a_rank_gone_after_its_clean_end_is_finished_not_down_on_a_first_read():
    """A top started after rank 1 ended (rank 0 still saving) called it DOWN, with no number."""
    gone = lambda: top.RankRow("t1", up=False)  # noqa: E731 - never read: no rank number
    ended = lambda: [_monitor(0, 10, 2, {0: 0.1}, 1), gone()]  # noqa: E731
    first, second = _reads(ended(), ended())
    assert second[1].startswith("finished: ended cleanly by "), second
    assert "the monitoring rank read its end mark" in second[1]
    # Killed, not ended: the monitoring rank still publishes its heartbeat's age.
    killed = lambda: [_monitor(0, 10, 2, {0: 0.1, 1: 3.0}, 0), gone()]  # noqa: E731
    assert _reads(killed(), killed())[1][-1].startswith("DOWN"), _reads(killed(), killed())
    # Of 4 ranks, ranks 2 and 3 are unread: one ended, one was killed. Neither is named ended.
    mixed = lambda: [_monitor(0, 10, 4, {0: 0.1, 1: 0.5, 3: 2.0}, 1), _row(1, 10), gone()]  # noqa: E731
    assert _reads(mixed(), mixed())[1][-1].startswith("DOWN")
    # A larger run publishes only late peers: one left out may be alive, so nothing is inferred.
    big = lambda: [_monitor(0, 10, 100, {0: 0.1}, 1), gone()]  # noqa: E731
    assert _reads(big(), big())[1][-1].startswith("DOWN")


def _in_section(row, started, deadline=600.0, name="checkpoint"):
    row.sections[name] = (started, deadline)
    row.section_deadline[name] = deadline
    return row


@pytest.mark.unit
def test_a_rank_in_a_declared_section_and_the_ranks_it_holds_up_are_not_hung():
    now = time.time()
    # Rank 0 saves a checkpoint inside exporter.deadline(); ranks 1 and 2 wait in the allreduce.
    rows = lambda: [_in_section(_row(0, 9), now - 40), _row(1, 10, age=40), _row(2, 10, age=40)]  # noqa: E731
    previous, tables = None, []
    for _ in range(3):
        table = top.diagnose(rows(), previous, now=now)
        previous = {r.target: r for r in table}
        tables.append(table)
    last = {r.rank: r for r in tables[-1]}
    assert not any(r.verdict for r in last.values()), [r.verdict for r in last.values()]
    assert last[0].note.startswith("in section checkpoint for 40 s of 600 s")
    assert "declared section" in last[1].note and "declared section" in last[2].note
    # Past its deadline the section excuses nobody: rank 0 is behind, and named.
    late = lambda: [_in_section(_row(0, 9), now - 700), _row(1, 10, age=40), _row(2, 10, age=40)]  # noqa: E731
    first = top.diagnose(late(), now=now)
    second = top.diagnose(late(), {r.target: r for r in first}, now=now)
    assert second[0].verdict.startswith("HUNG"), second[0].verdict


@pytest.mark.unit
def test_after_a_section_its_rank_has_a_stall_threshold_to_come_before_it_is_hung():
    start = time.time()
    stall = DEFAULT.hang_policy.stall_seconds(0.02)

    # Rank 0 evaluates for 90 s inside exporter.deadline() while ranks 1 and 2 wait in the
    # allreduce, then works on outside any section and never reaches it. Read every 2 s.
    def rows(t):
        inside = t < 4.0
        zero = _row(0, 9)
        if inside:
            _in_section(zero, start - 90, name="evaluation")
        return [zero, _row(1, 10, age=90 + t), _row(2, 10, age=90 + t)]

    reads = top.ReadHistory(0.0)
    verdicts = {}
    for i in range(20):
        t = 2.0 * i
        for r in (table := rows(t)):
            r.read_at = start + t
        verdicts[t] = {r.rank: r for r in reads.judge(table, now=start + t)}
    # While it lasts, the table says who is in a section and who waits for it.
    during = verdicts[2.0]
    assert during[0].note.startswith("in section evaluation for 92 s"), during[0].note
    assert all("declared section" in during[r].note for r in (1, 2)), during
    # The section ended between the reads at 2 s and 4 s: the wait counts from the read at 2 s.
    quiet = [t for t in verdicts if t <= 2.0 + stall]
    assert not any(r.verdict for t in quiet for r in verdicts[t].values()), [
        (t, r.verdict) for t in quiet for r in verdicts[t].values() if r.verdict
    ]
    hung = verdicts[max(verdicts)][0]
    assert hung.verdict.startswith("HUNG") and "never entered #10" in hung.verdict, hung.verdict
    # Named from the section's end: ranks 1 and 2 wait 38 s since then, not 128 s.
    assert "wait in for 36 s" in hung.verdict, hung.verdict
    # Without the memory of the section's end (one read judged alone), it is named at once.
    first = top.diagnose(rows(4.0), now=start + 4.0)
    second = top.diagnose(rows(6.0), {r.target: r for r in first}, now=start + 6.0)
    assert second[0].verdict.startswith("HUNG"), second[0].verdict


@pytest.mark.unit
def test_a_top_started_after_a_section_counts_the_wait_from_its_published_end():
    """A top with no earlier read (or --once) called the section's rank HUNG at its first read
    after the section: it had no memory of the end. The rank publishes it, as the rules read it."""
    ended = time.time()
    stall = DEFAULT.hang_policy.stall_seconds(0.02)

    def judged(t):  # two reads of a top started t s after the section's end
        def rows():
            zero = _row(0, 9)
            zero.section_ended = ended
            return [zero, _row(1, 10, age=90 + t), _row(2, 10, age=90 + t)]

        first = top.diagnose(rows(), now=ended + t)
        return top.diagnose(rows(), {r.target: r for r in first}, now=ended + t)

    soon = judged(stall / 2)
    assert not any(r.verdict for r in soon), [r.verdict for r in soon]
    late = judged(stall + 5)
    assert late[0].verdict.startswith("HUNG"), late[0].verdict
    assert f"wait in for {stall + 5:.0f} s" in late[0].verdict, late[0].verdict


@pytest.mark.unit
def test_a_group_held_up_through_a_rank_waiting_for_a_section_is_not_stuck():
    now = time.time()

    # Groups a = {0, 1} and b = {1, 2} (a 2-D mesh's shard and replicate groups): rank 0
    # evaluates inside exporter.deadline(); rank 1 waits for it in a, so never enters b's next
    # collective, where rank 2 waits: nobody behind in b, for past the symmetric threshold.
    def rows():
        zero, one, two = (
            _in_section(_row(0, 46), now - 90, name="evaluation"),
            _row(1, 47),
            _row(2, 21),
        )
        zero.pg_seq, zero.pg_age = {"a": 46}, {"a": 0.0}
        one.pg_seq, one.pg_age = {"a": 47, "b": 20}, {"a": 90.0, "b": 0.0}
        two.pg_seq, two.pg_age = {"b": 21}, {"b": 90.0}
        for r in (zero, one, two):
            r.pg_timeout = dict.fromkeys(r.pg_seq, 1800.0)
        return [zero, one, two]

    previous, history = None, top.ReadHistory(0.0)
    for _ in range(3):
        table = top.diagnose(rows(), previous, now=now)
        previous = {r.target: r for r in table}
        remembered = history.judge(rows(), now=now)  # with the memory of sections, as top runs
    for read in (table, remembered):
        last = {r.rank: r for r in read}
        assert not any(r.verdict for r in last.values()), [r.verdict for r in last.values()]
        assert "declared section" in last[2].note, last[2].note


@pytest.mark.unit
def test_a_rank_that_ended_cleanly_is_finished_not_down():
    last_read = [_row(0, 5), _row(1, 5)]
    last_read[1].finished = time.time()  # its final scrape said so
    gone = [_row(0, 5), top.RankRow("t1", up=False)]
    verdicts = _reads(last_read, gone, [_row(0, 5), top.RankRow("t1", up=False)])
    assert verdicts[1][1].startswith("finished: ended cleanly")
    assert verdicts[2][1].startswith("finished") and not top.accuses(
        top.RankRow("t1", verdict=verdicts[2][1])
    )


@pytest.mark.unit
def test_a_rank_gone_as_its_peers_ended_cleanly_ended_with_them():
    """Its endpoint closed before a late reader saw its end: not a dead rank."""

    def ended(rank):
        row = _row(rank, 5)
        row.finished = time.time()
        return row

    running = [_row(0, 5), _row(1, 5), _row(2, 5)]
    gone = lambda: [ended(0), ended(1), top.RankRow("t2", up=False)]  # noqa: E731
    verdicts = _reads(running, gone(), gone())
    assert verdicts[1][2].startswith("finished: ended with its peers"), verdicts
    assert verdicts[2][2].startswith("finished: ended with its peers"), verdicts
    # A rank already down while its peers ran stays down when they end.
    down = [_row(0, 5), _row(1, 5), top.RankRow("t2", up=False)]
    verdicts = _reads(running, down, down, [ended(0), ended(1), top.RankRow("t2", up=False)])
    assert verdicts[3][2].startswith("DOWN"), verdicts


@pytest.mark.tool
def test_top_judges_with_the_config_the_rules_were_generated_with(tmp_path):
    from exporter.mixin.config import config_json, load_config

    def slow():
        return [_row(0, 5), _row(1, 5, compute=0.2), _row(2, 5)]

    def later():
        return [_row(0, 6, steps=200), _row(1, 6, compute=0.2, steps=200), _row(2, 6, steps=200)]

    assert _reads(slow(), later())[1][1].startswith("straggler")
    path = tmp_path / "mixin.json"
    lenient = dataclasses.replace(FAST, straggler_ratio=10.0)
    path.write_text(config_json(lenient))
    assert load_config(path) == lenient
    first = top.diagnose(slow(), config=load_config(path))
    second = top.diagnose(later(), {r.target: r for r in first}, config=load_config(path))
    assert not any(r.verdict for r in second)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.tools.cli",
            "top",
            "--targets",
            "127.0.0.1:9",
            "--once",
            "--refresh",
            "0.1",
            "--config",
            str(tmp_path / "missing.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert res.returncode == 2 and "--config: cannot read the mixin config" in res.stderr


def _stack(tmp_path) -> tuple[LocalStack, object]:
    try:
        find_binaries()
    except MissingBinaryError as exc:
        pytest.skip(str(exc))
    sd = tmp_path / "sd"
    sd.mkdir()
    return LocalStack(tmp_path / "stack", sd), sd


@pytest.mark.stack
def test_healthy_then_hung_job_under_torchrun(tmp_path):
    st, sd = _stack(tmp_path)
    run = "top-hang"
    args = [
        "--fault",
        "hang",
        "--fault-rank",
        "1",
        # Long enough for several healthy reads after Prometheus first scraped the steps, on
        # a busy host too (reaching that took 20 of 25 s once).
        "--fault-after",
        "40",
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        "--heartbeat",
        "1",
        "--file-sd",
        str(sd),
    ]
    with st, Job(3, args, env={"DDP_EXPORTER_RUN": run}) as job:
        job.wait_urls()
        wait_for(lambda: len(st.query(f'ddp_steps_total{{run="{run}"}} > 5')) == 3, 60, "scrapes")
        reader = TopReader([job.urls[r] for r in sorted(job.urls)], st.prometheus_url, run)
        healthy_reads = 0
        while "injecting fault hang" not in job.output():
            for mode, table in reader.read().items():
                assert not any(table.values()), (mode, healthy_reads, table)
            healthy_reads += 1
            time.sleep(0.5)
        assert healthy_reads >= 10, healthy_reads
        # The CLI, once, from Prometheus: every rank, nobody accused yet.
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter.tools.cli",
                "top",
                "--prometheus",
                st.prometheus_url,
                "--run",
                run,
                "--once",
                "--refresh",
                "0.5",
                "--window",
                FAST.rate_window,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert res.returncode == 0, res.stderr
        assert sorted(line.split()[0] for line in res.stdout.splitlines()[1:]) == ["0", "1", "2"]

        def named() -> bool:
            latest = reader.read()
            for mode, table in latest.items():
                wrong = {r: v for r, v in table.items() if r != 1 and v.startswith(top.ACCUSATIONS)}
                assert not wrong, (mode, wrong)
            return all(t[1].startswith("HUNG") for t in latest.values())

        wait_for(named, 60, "top to name rank 1 HUNG from both sources", interval=0.5)
    print(f"\ntop: {healthy_reads} healthy reads per source, no verdict")


#: The first read from the endpoints that names a straggler of the whole run, reads at least
#: 1 s apart: read 0 is the baseline, read 1 the first suspicion, which must hold for the hold.
HELD_FROM = 1 + math.ceil(ENDPOINT_HOLD_S)


@pytest.mark.stack
def test_straggler_is_named_in_every_table_after_the_hold(tmp_path):
    st, sd = _stack(tmp_path)
    run = "top-straggler"
    args = [
        "--fault",
        "straggler",
        "--fault-rank",
        "2",
        "--fault-after",
        "0",
        "--straggle",
        "0.12",
        "--step-time",
        "0.02",
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        "--heartbeat",
        "1",
        "--file-sd",
        str(sd),
    ]
    with st, Job(3, args, env={"DDP_EXPORTER_RUN": run}) as job:
        job.wait_urls()
        # Prometheus has two full rate windows of the straggling job: top's first read from it
        # looks one window back.
        seconds = 2 * duration_seconds(FAST.rate_window)
        window = f'count_over_time(ddp_steps_total{{run="{run}"}}[{seconds}s]) > {seconds - 5}'
        wait_for(lambda: len(st.query(window)) == 3, 120, "two full rate windows of scrapes")
        reader = TopReader([job.urls[r] for r in sorted(job.urls)], st.prometheus_url, run)
        for _ in range(HELD_FROM + 4):
            reader.read()
            time.sleep(1.0)
        # The command line, once, from Prometheus: its read one window back, never shown, is
        # what confirms the straggler in the one table it prints.
        cli = [sys.executable, "-m", "exporter.tools.cli", "top", "--prometheus"]
        cli += [st.prometheus_url, "--run", run, "--once", "--refresh", "0.5"]
        res = subprocess.run(
            [*cli, "--window", FAST.rate_window],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    for mode, tables in reader.tables.items():
        # From Prometheus, the read one window back confirms the first table already; from
        # the endpoints, the first read is the baseline and the straggler must then hold.
        for i, table in enumerate(tables[HELD_FROM:] if mode == "targets" else tables):
            assert table[2].startswith("straggler: compute"), (mode, i, table)
            assert not table[0] and not table[1], (mode, i, table)
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[1:] if line.strip()}
    assert "straggler: compute" in rows["2"], res.stdout
    assert "straggler" not in rows["0"] + rows["1"], res.stdout


@pytest.mark.unit
def test_the_table_says_the_attempt_and_the_restart_loop():
    rows = [_row(0, 5), _row(1, 5)]
    assert "restarts" not in top.render(top.diagnose(rows))  # a first attempt, no action
    for r in rows:
        r.attempt = "3"
    monitor = rows[0]
    monitor.abort_streak, monitor.abort_limit = 3.0, 3.0
    monitor.aborted_attempts = [
        ("1", "1", "bad", 110.0),
        ("0", "1", "bad", 110.0),
        ("2", "", "", 112.0),
    ]
    line = top.render(top.diagnose(rows)).splitlines()[-1]
    assert line == (
        "restarts: attempt 3; hang aborts without progress 3 of 3; aborted attempt 0: rank 1 "
        "on bad, step 110; attempt 1: rank 1 on bad, step 110; attempt 2: every rank stuck, "
        "step 112; RESTART LOOP: the hang action stopped"
    )
    monitor.abort_streak, monitor.aborted_attempts = 0.0, []
    assert top.restart_line(rows) == "restarts: attempt 3; hang aborts without progress 0 of 3"


@pytest.mark.stack
def test_the_same_run_name_in_two_clusters_is_never_merged(tmp_path):
    """Two real jobs named alike, labelled cluster a and b by discovery: top picks one."""
    from promstack import fast_config, file_sd_scrape, run_prometheus, write_file_sd

    sd = tmp_path / "sd"
    sd.mkdir()
    run = "same-name"
    args = ["--port", "0", "--addr", "127.0.0.1", "--heartbeat", "1", "--step-time", "0.05"]
    with (
        Job(2, args, env={"DDP_EXPORTER_RUN": run}) as a,
        Job(2, args, env={"DDP_EXPORTER_RUN": run}) as b,
    ):
        targets = [
            (url.split("//")[1].split("/")[0], {"run": run, "rank": str(r), "cluster": name})
            for name, job in (("a", a), ("b", b))
            for r, url in sorted(job.wait_urls().items())
        ]
        write_file_sd(sd / "ranks.json", targets)
        with run_prometheus(
            tmp_path / "prom", fast_config(tmp_path / "prom", file_sd_scrape(sd))
        ) as prom:
            wait_for(
                lambda: len(prom.query(f'ddp_steps_total{{run="{run}"}} > 3')) == 4,
                60,
                "both jobs scraped",
            )
            with pytest.raises(RuntimeError, match=r"in 2 clusters \(a, b\): choose one"):
                top.fetch_prometheus(prom.url, run, window=FAST.rate_window)
            rows = top.fetch_prometheus(prom.url, run, window=FAST.rate_window, cluster="b")
            assert [r.rank for r in rows] == [0, 1] and all(r.up for r in rows), rows
            cli = [
                sys.executable,
                "-m",
                "exporter.tools.cli",
                "top",
                "--prometheus",
                prom.url,
                "--run",
                run,
                "--once",
                "--refresh",
                "0.5",
                "--window",
                FAST.rate_window,
            ]
            res = subprocess.run(cli, capture_output=True, text=True, timeout=60, cwd=REPO)
            assert res.returncode == 1 and "--cluster" in res.stderr, (res.stdout, res.stderr)
            res = subprocess.run(
                [*cli, "--cluster", "a"], capture_output=True, text=True, timeout=60, cwd=REPO
            )
            assert res.returncode == 0, res.stderr
            assert sorted(line.split()[0] for line in res.stdout.splitlines()[1:]) == ["0", "1"]


@pytest.mark.job
def test_once_names_a_straggler_that_began_after_the_job(tmp_path):
    """``top --once`` judges the intervals the streaming view judges, not averages since start.

    Rank 2 trains healthy for 8 s (about 160 steps), then straggles: its compute averaged
    since its start is still close to the others', but every interval after the onset shows it.
    """
    args = [
        "--fault",
        "straggler",
        "--fault-rank",
        "2",
        "--fault-after",
        "8",
        "--straggle",
        "0.15",
        "--step-time",
        "0.05",
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
    ]
    with Job(3, args, env={"DDP_EXPORTER_RUN": "top-once", "OMP_NUM_THREADS": "1"}) as job:
        urls = job.wait_urls()
        wait_for(lambda: job.seen("injecting fault straggler"), 60, "the straggler's onset")
        targets = ",".join(urls[r].split("//")[1].split("/")[0] for r in sorted(urls))
        cli = [
            sys.executable,
            "-m",
            "exporter.tools.cli",
            "top",
            "--targets",
            targets,
            "--once",
            "--refresh",
            "2",
        ]
        res = subprocess.run(cli, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[1:] if line.strip()}
    assert "straggler: compute" in rows["2"], res.stdout
    assert "straggler" not in rows["0"] + rows["1"], res.stdout  # nobody else accused
