"""A DDP step's waits for collectives of its own, on a real one-rank gloo group.

The waits of a one-rank group take microseconds: the recorder's clock moves half a second at
each reading, so a wait that is counted adds exactly that to the step's comm_wait.
"""

from __future__ import annotations

import threading

import pytest
import torch

from exporter.errors import ErrorCounter
from exporter.sources.recorder import Recorder
from exporter.sources.waits import WaitTiming

pytestmark = pytest.mark.unit


class Ticking:
    """A clock that moves 0.5 s at each reading."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def one_step(rec: Recorder, work) -> tuple[float, float]:
    """Run ``work`` inside one step of the DDP split (steps closed by the optimizer); return
    the step's (compute, comm_wait)."""
    rec.open_step()
    work()
    rec.optimizer_begin()
    rec.optimizer_end()
    _data, compute, comm, _opt = rec.snapshot().phase_sum
    return compute, comm


def test_the_training_threads_waits_are_comm_wait_and_nothing_else_is_counted(world1):
    dist = world1
    original = dist.Work.wait
    rec, errors = Recorder("optimizer", clock=Ticking()), ErrorCounter()
    waits = WaitTiming(rec, errors)
    assert waits.instrument() and waits.instrument()  # idempotent
    try:
        # A synchronous all_reduce waits once; an asynchronous one where its caller waits.
        compute, comm = one_step(rec, lambda: dist.all_reduce(torch.ones(4)))
        assert comm == pytest.approx(0.5) and compute > 0.0
        work = dist.all_reduce(torch.ones(4), async_op=True)
        _, comm = one_step(rec, work.wait)
        assert comm == pytest.approx(1.0)
        # Another thread's waits are not the step's.
        other = threading.Thread(target=lambda: dist.barrier())
        _, comm = one_step(rec, lambda: (other.start(), other.join()))
        assert comm == pytest.approx(1.0)
    finally:
        waits.uninstrument()
        waits.uninstrument()
    assert dist.Work.wait is original and not waits.instrumented
    assert rec.snapshot().collectives == []  # no collective counted: DDP's series stay DDP's
    assert not any(errors.snapshot().values())


def test_a_failing_recorder_never_fails_the_wait_and_another_wrapper_is_left_in_place(world1):
    dist = world1
    original = dist.Work.wait
    rec, errors = Recorder("optimizer"), ErrorCounter()

    def broken(seconds: float) -> None:
        raise RuntimeError("recorder broke")

    rec.comm_blocked = broken  # type: ignore[method-assign]
    waits = WaitTiming(rec, errors)
    waits.instrument()
    try:
        out = torch.ones(4)
        dist.all_reduce(out)
        assert torch.equal(out, torch.ones(4))  # the collective ran and returned
        assert errors.snapshot().get("comm_timing") == 1
        theirs = dist.Work.wait

        def wrapped_again(work, *args, **kwargs):
            return theirs(work, *args, **kwargs)

        dist.Work.wait = wrapped_again  # someone wraps it after the exporter
        waits.uninstrument()
        assert dist.Work.wait is wrapped_again  # theirs stays
    finally:
        dist.Work.wait = original
