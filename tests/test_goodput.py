"""The goodput account: every second of a simulated job in its category, and on disk.

tests/goodput_sim.py runs a lockstep job in simulated time and feeds the account as the tracker
does: the ranks' work read at their own phase of the interval, the monitoring rank's own step
split, its sections, the hang watcher's episodes. Each fault must land in its category, on the
rank that caused it, and the categories must add up to the wall clock.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from goodput_sim import HANG_THRESHOLD_S, Sim

from exporter import catalog
from exporter.sources.goodput import (
    CATEGORIES,
    Carried,
    Episode,
    PeerTally,
    Work,
    document,
    load_carried,
    render,
    section_category,
)
from exporter.sources.goodput.ledger import goodput_path, save
from exporter.sources.goodput.peers import PERSIST_MIN, decode_work, encode_work
from exporter.sources.goodput.tracker import CpuWait, HostWait

pytestmark = pytest.mark.unit


def _wall(sim: Sim) -> float:
    return sim.now - sim.account.run_start


def _sums_to_wall(totals: dict[str, float], wall: float) -> None:
    assert sum(totals.values()) == pytest.approx(wall, rel=1e-6), totals


def test_the_categories_are_the_catalog_s_and_sections_have_theirs() -> None:
    assert CATEGORIES == catalog.GOODPUT_CATEGORIES
    assert section_category("checkpoint") == section_category("save_ckpt") == "checkpoint"
    assert section_category("evaluation") == section_category("validate") == "evaluation"
    assert section_category("data_prep") == "section"


def test_a_healthy_job_is_productive_after_its_startup() -> None:
    sim = Sim(startup=5.0)
    sim.steps(300)
    totals = sim.end()
    _sums_to_wall(totals, _wall(sim))
    assert totals["startup"] == pytest.approx(5.0, abs=0.01)
    assert totals["productive"] == pytest.approx(300 * 0.107, rel=0.01)
    for cat in ("straggler", "communication", "hang", "restart", "lost_work", "data"):
        assert totals[cat] < 0.05, (cat, totals)
    assert totals["other"] < 0.05


@pytest.mark.parametrize("culprit", [1, 2, 0])
def test_a_straggler_s_cost_is_what_the_others_waited_blamed_on_it(culprit: int) -> None:
    sim = Sim()
    sim.steps(50)
    sim.steps(60, compute={culprit: 0.1})  # 6 s the others wait for it
    sim.steps(50)
    totals = sim.end()
    _sums_to_wall(totals, _wall(sim))
    assert totals["straggler"] == pytest.approx(6.0, rel=0.05), totals
    assert totals["productive"] == pytest.approx(160 * 0.107, rel=0.02), totals
    blame = sim.account.blame(sim.now)
    assert [(c, r) for c, r, _, _ in blame] == [("straggler", culprit)], blame
    (episode,) = sim.account.stragglers
    assert (episode["culprit_rank"], episode["cause"]) == (culprit, "compute")


def test_a_blip_of_one_window_is_no_straggler_and_a_lasting_one_is_an_episode() -> None:
    sim = Sim()
    sim.steps(50)
    sim.steps(1, compute={0: 0.08})  # one step: the run waited 0.08 s for rank 0
    sim.steps(50)
    totals = sim.end()
    assert totals["straggler"] == 0.0 and sim.account.stragglers == [], totals
    sim = Sim()
    sim.steps(50)
    sim.steps(60, compute={1: 0.1})
    sim.steps(50)
    sim.end()
    (episode,) = sim.account.state(sim.now)["stragglers"]
    assert episode["culprit_rank"] == 1 and episode["start_unix"] <= episode["end_unix"]


@pytest.mark.parametrize("extra", [0.01, 0.03])
def test_jitter_that_moves_from_rank_to_rank_is_the_healthy_pace(extra: float) -> None:
    """Each second a different rank is the slowest (a noisy neighbour on shared cores)."""
    sim = Sim()
    sim.steps(100)
    for window in range(60):
        sim.steps(10, compute={window % 3: extra})  # 10 % or 30 % over its peers this second
    totals = sim.end()
    assert totals["straggler"] == 0.0 and sim.account.stragglers == [], totals
    # What is not credited to a slower rank (windows read at each rank's own phase straddle the
    # seconds) is left to the communication baseline: far above DDPGoodputLow's 85 %.
    assert totals["productive"] >= 0.9 * (_wall(sim) - totals["startup"]), totals


def test_a_slow_reader_is_a_straggler_by_data_and_a_slow_input_for_all_is_data() -> None:
    sim = Sim()
    sim.steps(20)
    sim.steps(40, data={1: 0.05})
    sim.steps(20)
    sim.steps(40, data={0: 0.05, 1: 0.05, 2: 0.05})
    sim.steps(20)
    totals = sim.end()
    assert totals["straggler"] == pytest.approx(2.0, rel=0.1), totals
    assert sim.account.stragglers[0]["cause"] == "data"
    assert totals["data"] == pytest.approx(2.0, rel=0.1), totals


def test_a_slower_network_is_communication_beyond_the_baseline() -> None:
    sim = Sim()
    sim.steps(100)
    sim.steps(50, comm=0.105)  # 0.1 s more per step on every rank alike
    sim.steps(50)
    totals = sim.end()
    assert totals["communication"] == pytest.approx(5.0, rel=0.05), totals
    assert totals["straggler"] < 0.05


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jitter_is_the_healthy_pace_and_a_lasting_slowdown_is_communication(seed: int) -> None:
    rng = random.Random(seed)
    sim = Sim()
    for _ in range(600):
        sim.one_step(comm=rng.uniform(0.0, 0.04))  # 0.02 s on average, never the same twice
    totals = sim.end()
    assert totals["communication"] < 0.01 * _wall(sim), totals
    rng = random.Random(seed)
    sim = Sim()
    for i in range(600):
        sim.one_step(comm=rng.uniform(0.0, 0.04) + (0.05 if 200 <= i < 300 else 0.0))
    totals = sim.end()
    # 5 s more in all. Over half of it counts: the baseline follows the run's recent steps (a
    # slowdown that lasts becomes the run's pace), the noise band above the baseline and the
    # slack saved before it pay for the rest.
    assert 0.5 * 5.0 < totals["communication"] < 1.05 * 5.0, totals
    assert totals["straggler"] < 0.05, totals


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_collectives_slowed_by_a_busy_host_are_the_healthy_pace(seed: int) -> None:
    """Exposed communication as a loaded host gives it: drifting up, jittering, rare spikes."""
    rng = random.Random(seed)
    sim = Sim()
    for i in range(1200):
        # A neighbour's load comes and goes: +15 % over the run, +-30 % per step, and one step
        # in a hundred descheduled in the collective for eight times as long.
        comm = 0.03 * (1 + 0.15 * i / 1200) * rng.uniform(0.7, 1.3)
        sim.one_step(comm=comm * 8 if rng.random() < 0.01 else comm)
    totals = sim.end()
    assert totals["communication"] < 0.01 * _wall(sim), totals


def test_cpu_wait_is_the_longest_wait_of_one_thread_between_reads() -> None:
    reads = iter(
        [
            {1: 0.0, 2: 0.0},
            {1: 0.5, 2: 0.3, 3: 9.0},  # thread 3 is new: it counts from here
            {1: 0.6, 2: 1.3, 3: 9.2},
            None,  # unreadable: nothing more
            {2: 1.4},  # thread 1 ended: never a negative wait
        ]
    )
    wait = CpuWait(lambda: next(reads))
    assert [wait.read() for _ in range(4)] == pytest.approx([0.5, 1.5, 1.5, 1.6])


def test_the_run_s_cpu_wait_is_the_longest_wait_of_one_rank_between_reads() -> None:
    """A collective waits for its slowest participant: a peer's threads waiting to run slow
    the monitoring rank's collectives as much as its own; ranks wait side by side."""
    wait = HostWait()
    assert wait.read({0: 1.0}) == 0.0  # each rank counts from its first reading
    assert wait.read({0: 1.1, 1: 5.0}) == pytest.approx(0.1)
    assert wait.read({0: 1.2, 1: 5.5}) == pytest.approx(0.6)  # the peer waited longest
    assert wait.read({0: 1.3}) == pytest.approx(0.7)  # no peer read this time: its own
    assert wait.read({0: 1.3, 1: 5.4}) == pytest.approx(0.7)  # never a negative wait


def test_a_rank_s_cpu_wait_travels_with_its_work_and_is_no_work() -> None:
    work = Work(7, 0.5, 2.0, 0.0, 0.0, 0.0, cpu_wait_s=0.25)
    assert decode_work(encode_work(work)) == work
    assert decode_work(encode_work(work)).cpu_wait_s == 0.25
    # Waiting alone is not moving: a hung rank whose threads wait does not close a window.
    assert Work(7, 0.5, 2.0, cpu_wait_s=0.9) == work
    assert decode_work(encode_work(work, finished=True)) is None
    # An earlier version's reading (no CPU wait) and a later one's (a field more) still read.
    assert decode_work("[7, 0.5, 2.0, 0, 0, 0, 0]") == Work(7, 0.5, 2.0)
    assert decode_work("[7, 0.5, 2.0, 0, 0, 0, 0, 0.25, 3]").cpu_wait_s == 0.25


def test_collectives_slowed_while_the_rank_waited_for_a_cpu_are_the_host_s_pace() -> None:
    """Collectives slower with compute at its pace (FSDP2's overlap lost on a busy host): the
    time the rank's threads waited for a CPU meanwhile is the host's, not the network's."""
    sim = Sim()
    sim.steps(100)
    for _ in range(50):
        sim.one_step(comm=0.105, cpu_wait=0.12)  # the collectives' threads were descheduled
    sim.steps(50)
    assert sim.end()["communication"] < 0.05
    # Waits for a CPU that cover part of the slowdown excuse that part only.
    sim = Sim()
    sim.steps(100)
    for _ in range(50):
        sim.one_step(comm=0.105, cpu_wait=0.04)
    sim.steps(50)
    assert sim.end()["communication"] == pytest.approx(50 * 0.06, rel=0.1)


def test_a_wait_read_a_heartbeat_after_the_steps_it_slowed_still_explains_them() -> None:
    """The other ranks publish their waits once a heartbeat: a wait arrives after the steps
    it slowed, and explains them within the account's hold; long after, or before them, it
    explains nothing."""
    sim = Sim()
    sim.steps(100)
    for _ in range(5):
        sim.steps(5, comm=0.105)  # slowed: no wait read yet
        sim.one_step(cpu_wait=0.5)  # a peer's reading, a beat later
    sim.steps(50)
    assert sim.end()["communication"] < 0.05
    sim = Sim()
    sim.steps(100)
    sim.steps(25, comm=0.105)
    sim.steps(60)
    sim.one_step(cpu_wait=2.5)
    sim.steps(50)
    assert sim.end()["communication"] == pytest.approx(25 * 0.1, rel=0.1)
    # A wait read before the slowed steps did not slow them (a busy spell that ended).
    sim = Sim()
    sim.steps(100)
    sim.one_step(cpu_wait=2.5)
    sim.steps(25, comm=0.105)
    sim.steps(50)
    assert sim.end()["communication"] == pytest.approx(25 * 0.1, rel=0.1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_busy_host_slows_compute_and_collectives_alike_and_loses_nothing(seed: int) -> None:
    """Other processes take the cores for a while: every rank computes and communicates slower."""
    rng = random.Random(seed)
    sim = Sim(comm=0.03)
    for i in range(900):
        # Twice as slow for 300 steps (a checkpoint writer, another job), jitter throughout.
        busy = 1.0 if 300 <= i < 600 else 0.0
        extra = 0.1 * busy + rng.uniform(0.0, 0.01)
        sim.one_step(
            compute=dict.fromkeys(range(3), extra), comm=0.03 * (1 + busy) * rng.uniform(0.9, 1.1)
        )
    totals = sim.end()
    # Held to the baseline alone, the collectives' slowdown would count 1-2 % of the wall clock.
    assert totals["communication"] < 0.002 * _wall(sim), totals
    assert totals["straggler"] < 0.05, totals
    # Collectives three times slower for 100 steps, compute at its pace: the network, counted.
    sim = Sim(comm=0.03)
    for i in range(900):
        sim.one_step(comm=0.09 if 300 <= i < 400 else 0.03)
    totals = sim.end()
    assert totals["communication"] > 0.5 * 100 * 0.06, totals


@pytest.mark.parametrize("rank", [0, 2])
def test_a_declared_checkpoint_is_checkpoint_whoever_writes_it(rank: int) -> None:
    sim = Sim()
    sim.steps(50)
    sim.one_step(section=(rank, "checkpoint", 4.0))
    sim.steps(50)
    totals = sim.end()
    _sums_to_wall(totals, _wall(sim))
    assert totals["checkpoint"] == pytest.approx(4.0, rel=0.03), totals
    assert totals["straggler"] < 0.05 and totals["communication"] < 0.05, totals


def test_a_hang_that_recovers_is_hang_not_straggler() -> None:
    sim = Sim()
    sim.steps(50)
    sim.one_step(stall=(1, 14.0))
    sim.steps(50)
    totals = sim.end()
    _sums_to_wall(totals, _wall(sim))
    assert totals["hang"] == pytest.approx(14.0, abs=0.5), totals
    assert totals["straggler"] < 0.5 and totals["communication"] < 0.5, totals
    (hang,) = sim.account.hangs
    assert (hang["culprit_rank"], hang["node"], hang["how"]) == (1, "node-b", "recovered")
    assert ("hang", 1) in {(c, r) for c, r, _, _ in sim.account.blame(sim.now)}


def test_an_aborted_hang_ends_the_account_at_the_abort() -> None:
    sim = Sim()
    sim.steps(50)
    onset = sim.now
    sim.advance(HANG_THRESHOLD_S)
    sim.episode = Episode(1, onset, 2, "node-c")
    sim.advance(12.0)
    sim.tick()
    totals = sim.end("aborted")
    _sums_to_wall(totals, _wall(sim))
    assert totals["hang"] == pytest.approx(22.0, abs=0.01), totals
    sim.advance(5.0)  # the ranks leaving: nothing more is counted
    assert sim.totals() == totals


def test_counters_only_grow() -> None:
    sim = Sim()
    seen = dict.fromkeys(CATEGORIES, 0.0)
    for i in range(40):
        sim.steps(5, compute={1: 0.05} if 10 <= i < 20 else None)
        if i == 25:
            sim.one_step(section=(2, "evaluation", 2.0))
        now = sim.totals()
        for cat in CATEGORIES:
            assert now[cat] >= seen[cat] - 1e-9, (cat, now[cat], seen[cat])
        seen = now


def test_a_restarted_attempt_carries_the_account_and_counts_the_redone_steps(tmp_path) -> None:
    first = Sim(attempt="0", start_step=0)
    first.steps(100)
    first.advance(3.0)  # the open step before the crash: not split
    first.tick()
    state = document(
        run="r",
        world_size=3,
        state=first.account.state(first.now),
        blame=first.account.blame(first.now),
    )
    save(goodput_path(str(tmp_path), "r"), json.dumps(state))
    assert load_carried(str(tmp_path), "r", "0") is None  # attempt 0: a new job
    carried = load_carried(str(tmp_path), "r", "1")
    assert carried is not None and carried.furthest_step == 100
    gap = 20.0
    second = Sim(attempt="1", start=first.now + gap, startup=6.0, start_step=80, carried=carried)
    second.steps(120)
    totals = second.end()
    _sums_to_wall(totals, second.now - first.account.run_start)
    assert totals["restart"] == pytest.approx(gap + 6.0, abs=0.05), totals
    assert totals["lost_work"] == pytest.approx(20 * 0.107, rel=0.05), totals
    assert totals["productive"] == pytest.approx(200 * 0.107, rel=0.03), totals
    assert totals["startup"] == pytest.approx(5.0, abs=0.01)
    assert totals["other"] == pytest.approx(3.0, abs=0.3)  # what the crashed attempt left open


def test_the_tally_waits_for_every_rank_and_counts_a_lasting_excess() -> None:
    tally = PeerTally()
    assert tally.observe([Work(10, 0.0, 1.0)] * 3, 0.0) is None
    moved = [Work(20, 0.0, 2.0), Work(20, 0.0, 2.02), Work(10, 0.0, 1.0)]
    assert tally.observe(moved, 1.0) is None  # rank 2 has not moved: the window stays open
    found = None
    for window in range(1, PERSIST_MIN + 1):
        n = 10 * (window + 1)
        found = tally.observe(
            [
                Work(n, 0.0, n / 10),
                Work(n, 0.0, n / 10 + 0.02 * window),
                Work(n, 0.0, n / 10 + window),
            ],
            window + 1.0,
        )
        if window < PERSIST_MIN:
            assert found is not None and not found.lasting  # too few windows: jitter so far
    assert found is not None and found.culprit == 2 and found.lasting
    assert found.causes == pytest.approx({"compute": 0.98})  # over the median rank's 1.02 s
    n = 10 * (PERSIST_MIN + 2)
    noisy = [
        Work(n, 0.0, n / 10),
        Work(n, 0.0, n / 10 + 0.02 * PERSIST_MIN + 0.03),
        Work(n, 0.0, n / 10 + PERSIST_MIN + 0.04),
    ]
    assert tally.observe(noisy, 9.0) is None  # 3 % over the median: synchronous noise


def test_the_summary_names_the_account_its_bottleneck_and_episodes() -> None:
    sim = Sim()
    sim.steps(50)
    sim.steps(20, compute={2: 0.2})
    sim.steps(20)
    sim.end()
    blame = sim.account.blame(sim.now, lambda r: f"node-{r}")
    doc = document(run="r", world_size=3, state=sim.account.state(sim.now), blame=blame)
    assert doc["bottleneck"] == "compute-bound"
    assert doc["largest_badput"] == "startup"
    text = render(doc)
    # 20 steps 0.2 s slower: 4 s, less the part of the window of its onset (not yet lasting).
    cost = re.search(r"straggler episode: rank 2 \(node node-2\), compute, cost ([\d.]+) s", text)
    assert cost and 3.5 <= float(cost[1]) <= 4.0, text
    assert "ETTR" in text and "productive" in text
    assert json.loads(json.dumps(doc)) == doc


def test_the_carried_account_reads_what_was_written(tmp_path) -> None:
    carried = Carried(1.0, 2.0, {"productive": 1.0})
    assert carried.totals["productive"] == 1.0
    (tmp_path / "r-goodput.json").write_text('{"something": "else"}')
    with pytest.raises(ValueError, match="not a goodput account"):
        load_carried(str(tmp_path), "r", "1")


def test_the_summary_of_a_run_that_never_stepped_reads() -> None:
    # Every second planned (startup): no unplanned ETTR, and still a summary.
    sim = Sim(startup=5.0)
    sim.end()
    doc = document(run="r", state=sim.account.state(sim.now), blame=[])
    assert doc["unplanned_ettr"] is None
    assert "ETTR 0.0% (productive over the wall clock); without planned time" in render(doc)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("clean", "1 attempt, ended cleanly"),
        ("aborted", "1 attempt, aborted by the hang action"),
        ("ended", "1 attempt, ended not cleanly (an exception or Ctrl-C)"),  # Ctrl-C, an error
        ("evicted", "1 attempt, ended (evicted)"),  # a kind a later version writes
    ],
)
def test_the_summary_says_how_the_run_ended_in_words(how: str, said: str) -> None:
    sim = Sim()
    sim.steps(5)
    sim.end()
    doc = document(run="r", state=sim.account.state(sim.now), blame=[])
    doc.update(attempts=["0"], ended=how)
    head = render(doc).splitlines()[1]
    assert head.endswith(said), head
    assert "ended ended" not in head


def test_the_mixin_s_copies_of_the_definitions_agree() -> None:
    # The mixin does not import the library's sources: its copies must not drift.
    from exporter.mixin.alerts import goodput as alert
    from exporter.mixin.recording import PLANNED as RECORDED_PLANNED
    from exporter.sources.goodput import BLAMED, PLANNED

    assert RECORDED_PLANNED == PLANNED
    assert alert.BLAMED == BLAMED
    assert set(alert.UNPLANNED_BADPUT) == set(CATEGORIES) - set(PLANNED) - {"productive"}
