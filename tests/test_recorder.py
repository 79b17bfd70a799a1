"""Step and phase arithmetic of the hot-path recorder, with a hand-driven clock."""

import pytest
from harness import HandClock as Clock

from exporter.sources.recorder import Histogram, Recorder

pytestmark = pytest.mark.unit


def test_phases_add_up_and_comm_wait_is_the_exposed_tail():
    clock = Clock()
    rec = Recorder("optimizer", clock=clock)
    stats = rec.collective_stats("allreduce", "0", 60.0)
    rec.open_step()  # t=100: forward starts

    def at(t, fn, *args):
        clock.t = t
        return fn(*args)

    t = rec.data_begin()
    at(100.2, rec.data_end, t)  # 0.2 s of data wait
    b0 = at(100.5, rec.bucket_launched, stats, 1000)  # first bucket
    b1 = at(100.7, rec.bucket_launched, stats, 1000)  # last bucket: compute done
    at(100.6, rec.bucket_done, stats, b0, False)
    at(101.0, rec.bucket_done, stats, b1, True)  # waited 0.3 s on comm
    rec.optimizer_begin()
    at(101.1, rec.optimizer_end)
    snap = rec.snapshot()
    data, compute, comm, opt = snap.phase_sum
    assert snap.steps == 1
    assert (data, comm, opt) == pytest.approx((0.2, 0.3, 0.1))
    assert compute == pytest.approx(1.1 - 0.2 - 0.3 - 0.1)
    assert snap.step_sum == pytest.approx(1.1)
    assert snap.collectives[0][4] == 2 and snap.collectives[0][5] == 2000


def test_a_collective_outside_ddps_buckets_does_not_stretch_their_exposed_tail():
    """Hook timing: DDP's exposed communication is its last bucket's launch to the latest
    bucket's completion; a functional collective the step waits for later (DTensor) adds its
    own wait, and its completion is no bucket's."""
    clock = Clock()
    rec = Recorder("optimizer", clock=clock)
    ddp = rec.collective_stats("allreduce", "0", 60.0)
    other = rec.collective_stats("allreduce", "1", 60.0)
    rec.open_step()  # t=100

    def at(t, fn, *args):
        clock.t = t
        return fn(*args)

    b = at(100.5, rec.bucket_launched, ddp, 1000)  # backward compute done
    at(100.7, rec.bucket_done, ddp, b, True)  # DDP exposed 0.2 s
    t0 = at(100.9, rec.collective_launched, other, 8)  # after 0.2 s more of compute
    at(101.0, rec.collective_waited, other, t0, True, 0.1)  # waited 0.1 s for it
    rec.optimizer_begin()
    at(101.0, rec.optimizer_end)
    _data, compute, comm, _opt = rec.snapshot().phase_sum
    assert comm == pytest.approx(0.2 + 0.1)
    assert compute == pytest.approx(1.0 - 0.3)


def test_only_the_active_source_closes_steps():
    clock = Clock()
    rec = Recorder("optimizer", clock=clock)
    rec.open_step()
    rec.boundary("comm_hook")
    rec.boundary("explicit")
    assert rec.snapshot().steps == 0
    rec.optimizer_end()
    assert rec.snapshot().steps == 1


def test_inflight_bookkeeping_tracks_the_oldest_pending():
    clock = Clock()
    rec = Recorder("comm_hook", clock=clock)
    stats = rec.collective_stats("allreduce", "7", None)
    a = rec.bucket_launched(stats, 8)
    clock.t += 1.0
    rec.bucket_launched(stats, 8)
    clock.t += 2.0
    assert rec.inflight() == [("7", 2, 0, pytest.approx(3.0))]
    rec.bucket_done(stats, a, False)
    assert rec.inflight() == [("7", 2, 1, pytest.approx(2.0))]


def test_histogram_is_cumulative_with_le_semantics():
    h = Histogram((0.1, 1.0))
    for v in (0.1, 0.5, 2.0):
        h.observe(v)
    assert h.cumulative() == [("0.1", 1), ("1.0", 2), ("+Inf", 3)]
    assert h.count == 3 and h.sum == pytest.approx(2.6)


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="step mode"):
        Recorder("epoch")


def _stepping(clock, rec, dt=0.1):
    """Run one optimizer step of ``dt`` seconds of compute."""
    rec.open_step()
    clock.t += dt
    rec.optimizer_begin()
    rec.optimizer_end()


def test_a_section_that_interrupts_training_is_left_out_of_its_step():
    clock = Clock()
    rec = Recorder("optimizer", clock=clock)
    _stepping(clock, rec)  # step 1: 0.1 s
    rec.section_begin()  # rank 0 saves a checkpoint between two steps
    clock.t += 30.0
    rec.section_end()
    clock.t += 0.1
    rec.optimizer_begin()
    rec.optimizer_end()  # step 2: 0.1 s of compute, not 30.1
    snap = rec.snapshot()
    assert snap.steps == 2
    assert snap.step_sum == pytest.approx(0.2)
    assert snap.phase_sum[1] == pytest.approx(0.2)  # compute: the checkpoint is no straggler


def test_a_section_with_training_inside_counts_as_usual():
    clock = Clock()
    rec = Recorder("optimizer", clock=clock)
    rec.open_step()
    rec.section_begin()  # e.g. with exporter.deadline("epoch", ...): train_epoch()
    for _ in range(3):
        clock.t += 1.0
        rec.optimizer_begin()
        rec.optimizer_end()
    rec.section_end()
    snap = rec.snapshot()
    assert snap.steps == 3 and snap.step_sum == pytest.approx(3.0)


def test_explicit_steps_inside_a_section_are_counted():
    clock = Clock()
    rec = Recorder("explicit", clock=clock)
    rec.section_begin()  # an evaluation section made of exporter.step() blocks
    clock.t += 5.0  # set-up before the first batch: no step yet, left out
    for _ in range(2):
        rec.open_step()
        clock.t += 0.5
        rec.boundary("explicit")
    rec.section_end()
    snap = rec.snapshot()
    assert snap.steps == 2 and snap.step_sum == pytest.approx(1.0)


def test_nested_sections_end_with_the_outer_one():
    clock = Clock()
    rec = Recorder("optimizer", clock=clock)
    _stepping(clock, rec)
    rec.section_begin()
    clock.t += 1.0
    rec.section_begin()
    clock.t += 1.0
    rec.section_end()
    clock.t += 1.0
    rec.section_end()
    clock.t += 0.1
    rec.optimizer_begin()
    rec.optimizer_end()
    assert rec.snapshot().step_sum == pytest.approx(0.2)


def test_an_iteration_timed_after_a_scrape_never_lowers_the_compute_it_read():
    """DDP's iteration marks on a GPU resolve after their step closed: the exposed time comes
    out of compute not yet read, else out of the next step's, never out of what was scraped."""
    clock = Clock()
    rec = Recorder("optimizer", clock=clock)
    stats = rec.collective_stats("allreduce", "0", 60.0)

    def one_step():
        rec.open_step()
        clock.t += 1.0
        rec.optimizer_begin()
        rec.optimizer_end()

    one_step()
    read = rec.snapshot().phase_sum
    rec.iteration_timed(stats, 0.5, 0.4, 1000)  # the first step's, resolved after the scrape
    assert rec.snapshot().phase_sum == read
    one_step()  # pays the 0.4 s out of its own compute
    rec.iteration_timed(stats, 0.5, 0.3, 1000)  # no scrape since this step: moved at once
    _data, compute, comm, _opt = rec.snapshot().phase_sum
    assert comm == pytest.approx(0.7) and compute == pytest.approx(2.0 - 0.7)
