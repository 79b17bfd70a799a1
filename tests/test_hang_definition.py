"""The one hang definition (exporter.hangs.definition): behind, waiting, symmetric, and excused."""

import pytest

from exporter.hangs.definition import DEFAULT_POLICY, SeqState, find_hangs

pytestmark = pytest.mark.unit

STALL = DEFAULT_POLICY.stall_seconds(None)


def _group(*ranks):
    """Return states of pg 0 from ``(rank, last enqueued, in-flight age, in section)``."""
    return [SeqState(r, "0", seq, age, 1800.0, section) for r, seq, age, section in ranks]


def test_a_rank_behind_a_stalled_collective_is_named():
    (f,) = find_hangs(
        _group((0, 10, STALL + 5, False), (1, 9, 0, False), (2, 10, STALL + 5, False))
    )
    assert (f.kind, f.behind, f.waiting, f.excused) == ("behind", (1,), (0, 2), ())


def test_a_rank_behind_inside_a_declared_section_is_excused():
    # Rank 0 saves a checkpoint inside exporter.deadline(); the others wait in the allreduce.
    (f,) = find_hangs(_group((0, 9, 0, True), (1, 10, STALL + 5, False), (2, 10, STALL + 5, False)))
    assert (f.kind, f.behind, f.excused) == ("section", (), (0,))
    assert f.waiting == (1, 2)  # they wait for the section, not for a hung rank


def test_an_excused_rank_does_not_hide_another_rank_behind():
    (f,) = find_hangs(
        _group(
            (0, 9, 0, True), (1, 10, STALL + 5, False), (2, 8, 0, False), (3, 10, STALL + 5, False)
        )
    )
    assert (f.kind, f.behind, f.excused) == ("behind", (2,), (0,))


def test_every_rank_in_a_section_and_nobody_behind_is_excused():
    ranks = _group((0, 10, STALL + 5, True), (1, 10, STALL + 5, True))
    (f,) = find_hangs(ranks)
    assert (f.kind, f.excused) == ("section", (0, 1))


def test_nobody_behind_and_not_all_in_sections_is_waiting_then_symmetric():
    (f,) = find_hangs(_group((0, 10, STALL + 5, True), (1, 10, STALL + 5, False)))
    assert f.kind == "waiting"
    long = DEFAULT_POLICY.symmetric_seconds(None, 1800.0) + 1
    (f,) = find_hangs(_group((0, 10, long, False), (1, 10, long, False)))
    assert f.kind == "symmetric"


def test_a_lag_without_a_stall_means_nothing():
    assert find_hangs(_group((0, 10, 1.0, False), (1, 8, 0, False))) == []


def test_a_2d_mesh_names_the_culprit_not_the_rank_it_holds_up():
    """HSDP: shard groups "3" = {0, 1}, "4" = {2, 3}; replicate groups "1" = {0, 2}, "2" = {1, 3}.

    Rank 1 stops in user code. Rank 0 waits for it in the shard group and so never enters the
    replicate group's next collective, where rank 2 waits for rank 0: rank 0 is a victim.
    """
    states = [
        SeqState(0, "3", 241, 30.0, 1800.0, False),
        SeqState(1, "3", 240, 0.0, 1800.0, False),
        SeqState(0, "1", 80, 0.0, 1800.0, False),
        SeqState(2, "1", 81, 30.0, 1800.0, False),
        SeqState(1, "2", 80, 0.0, 1800.0, False),
        SeqState(3, "2", 81, 30.0, 1800.0, False),
        SeqState(2, "4", 245, 0.0, 1800.0, False),
        SeqState(3, "4", 245, 0.0, 1800.0, False),
    ]
    found = {f.pg: f for f in find_hangs(states, 0.01, DEFAULT_POLICY)}
    assert set(found) == {"1", "2", "3"}
    assert (found["3"].kind, found["3"].behind, found["3"].waiting) == ("behind", (1,), (0,))
    assert (found["2"].kind, found["2"].behind, found["2"].waiting) == ("behind", (1,), (3,))
    assert (found["1"].kind, found["1"].behind, found["1"].waiting) == ("waiting", (), (2,))
