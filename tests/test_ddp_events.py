"""Iteration marks (``comm_timing="events"``): DDP's allreduce untouched, each iteration timed.

In-process on a one-rank gloo group (what is marked, what is not, the step split, the slots),
and with two ranks in one process each (where the marks fall around DDP's own finalisation, and
that the straggler's peers, not the straggler, show the wait).
"""

import json
import os

import pytest
import torch
from conftest import train_epoch
from harness import REPO, Ranks, wait_for

import exporter
from exporter.errors import ErrorCounter
from exporter.sources.ddpevents import HostMarks, IterationEvents, events_unsupported
from exporter.sources.recorder import Recorder

WORKER = os.path.join(REPO, "tests", "workers", "events_worker.py")


def _resolved(obs: exporter.Observer) -> int:
    """Wait until every marked iteration is resolved; return how many were timed."""
    timing = obs.comm_instrumentor.parts[0]
    wait_for(lambda: timing.pending == 0, 30, "every marked iteration resolved")
    return obs.recorder.snapshot().collectives[0][4]


@pytest.mark.unit
def test_each_synchronising_iteration_is_one_observation(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(
        model,
        dataloader=loader,
        optimizer=opt,
        port=0,
        addr="127.0.0.1",
        heartbeat_s=0,
        comm_timing="events",
    )
    assert obs.comm_timing == "events" and obs.hook is None
    assert obs.info_labels()["comm_timing"] == "events"
    train_epoch(model, loader, opt)
    steps = len(loader)
    assert _resolved(obs) == steps
    # no_sync(): DDP reduces nothing, nothing is marked; a forward without backward neither.
    x, y = next(iter(loader))
    with model.no_sync():
        torch.nn.functional.mse_loss(model(x), y).backward()
    model(x)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    assert _resolved(obs) == steps + 1
    snap = obs.recorder.snapshot()
    (op, pg, _, latency_sum, count, nbytes) = snap.collectives[0]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert (op, count, nbytes) == ("allreduce", steps + 1, (steps + 1) * params)
    assert 0.0 < latency_sum / count < 5.0
    # The split still adds up to the steps: exposed communication moved out of compute.
    assert sum(snap.phase_sum) == pytest.approx(snap.step_sum, rel=1e-9)
    assert not any(obs.errors.snapshot().values()), obs.errors.snapshot()


@pytest.mark.unit
def test_a_users_hook_is_timed_too_and_uninstrument_restores(ddp):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model, loader, opt = ddp
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)  # before instrument()
    obs = exporter.instrument(
        model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0, comm_timing="events"
    )
    train_epoch(model, loader, opt)
    assert obs.comm_timing == "events" and _resolved(obs) == len(loader)
    marker = obs.comm_instrumentor.parts[0].marker
    assert marker is list(model.parameters())[-1]
    obs.close()
    obs.close()
    assert not marker._post_accumulate_grad_hooks, "the hook outlived close()"
    train_epoch(model, loader, opt)  # trains on, nothing recorded
    assert obs.recorder.snapshot().collectives[0][4] == len(loader)


class _Slow(HostMarks):
    """Marks the resolver sees as not done until released: a GPU far behind the host."""

    def __init__(self) -> None:
        self.released = False

    def done(self, marks):
        return self.released


@pytest.mark.unit
def test_a_gpu_far_behind_skips_iterations_instead_of_waiting(ddp):
    model, loader, opt = ddp
    recorder, errors = Recorder("optimizer"), ErrorCounter()
    stats = recorder.collective_stats("allreduce", "0", None)
    marks = _Slow()
    timing = IterationEvents(model, recorder, errors, stats, marks, slots=3, interval_s=0.01)
    timing.instrument()
    train_epoch(model, loader, opt)
    assert timing.pending == 3 and timing.skipped == len(loader) - 3
    assert stats.hist.count == 0
    marks.released = True
    wait_for(lambda: stats.hist.count == 3, 10, "the three slots resolved")
    train_epoch(model, loader, opt)  # the slots are free again
    timing.close()
    # Every iteration timed or counted untimed: ddp_collective_untimed_total.
    assert stats.hist.count > 3
    assert stats.hist.count + timing.skipped == stats.completed == 2 * len(loader)
    assert not any(errors.snapshot().values())


class _Broken(HostMarks):
    def mark(self, marks, i):
        raise RuntimeError("event gone")


@pytest.mark.unit
def test_a_failing_mark_is_counted_and_the_backward_goes_on(ddp):
    model, loader, opt = ddp
    recorder, errors = Recorder("optimizer"), ErrorCounter()
    stats = recorder.collective_stats("allreduce", "0", None)
    timing = IterationEvents(model, recorder, errors, stats, _Broken())
    timing.instrument()
    train_epoch(model, loader, opt)
    timing.close()
    assert errors.counts["comm_timing"] == len(loader)
    assert stats.hist.count == 0


@pytest.mark.unit
def test_what_cannot_be_marked_says_why():
    assert "not a DistributedDataParallel" in events_unsupported(torch.nn.Linear(2, 2))


@pytest.mark.job
def test_marks_fall_around_ddps_finalisation_and_the_straggler_shows_no_wait(tmp_path):
    out = tmp_path / "report.json"
    with Ranks(2, [WORKER, str(out)]) as ranks:
        assert ranks.wait(timeout=180) == {0: 0, 1: 0}, ranks.output()
    per_rank = json.loads(out.read_text())
    for report in per_rank:
        o = report["order"]
        assert o["marked"] == 6 and o["marks_per_iteration"] == [2] and o["resolved"] == 6, o
        # Compute end: this rank's own gradient, complete; communication end: the average.
        assert o["end_is_final"] and o["compute_end_is_own"] and o["own_averages_to_final"], o
        assert not o["errors"], o
        s = report["straggler"]
        assert s["timing"] == "events" and s["pending"] == 0 and not s["errors"], s
        assert s["count"] == s["steps"] == 6 and s["nbytes"] == 6 * s["param_bytes"], s
        assert sum(s["phase_sum"]) == pytest.approx(s["step_sum"], rel=1e-9)
    healthy, slow = per_rank[0]["straggler"], per_rank[1]["straggler"]
    # Rank 0 waits out rank 1's 0.4 s in every allreduce; rank 1 waits for nobody.
    wait = [r["phase_sum"][2] / r["steps"] for r in (healthy, slow)]
    # (Bounds for a busy machine: rank 0's own compute slows too and eats into its wait, and
    # the load delays either rank at random, so the straggler waits now and then as well. A
    # loaded run lost 0.17 s a step of rank 0's wait that way.)
    assert wait[0] > 0.1 and wait[0] - wait[1] > 0.1, wait
    latency = [r["latency_sum"] / r["count"] for r in (healthy, slow)]
    assert latency[1] < latency[0], latency
