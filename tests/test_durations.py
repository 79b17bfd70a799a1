"""Collectives' device times from the Flight Recorder, on a real one-rank gloo group.

A GPU cannot exist here: NCCL's recorder with timing on is stood in for by gloo's real one, its
retired entries given the ``duration_ms`` NCCL writes (``TORCH_NCCL_ENABLE_TIMING=1``), and the
wrappers count as they do on CUDA (untimed), so the durations are what times them.
"""

from __future__ import annotations

import logging
import pickle
import time

import pytest
import torch
from harness import collected, parse, value, wait_for

from exporter.errors import ErrorCounter
from exporter.sources.collectives import CollectiveTiming
from exporter.sources.durations import READS_BEFORE_GIVING_UP, RecorderDurations
from exporter.sources.recorder import Recorder

pytestmark = pytest.mark.unit


def gloo_dump(**kwargs):
    return pickle.loads(torch._C._distributed_c10d._dump_fr_trace(**kwargs))


def timed_like_nccl(seconds: float):
    """Return gloo's recorder as NCCL's reads with timing on: each retired entry timed."""

    def dump(**kwargs):
        data = gloo_dump(**kwargs)
        for e in data.get("entries") or []:
            if e.get("retired"):
                e.update(state="completed", duration_ms=seconds * 1e3)
        return data

    return dump


def scrape(rec: Recorder, errors: ErrorCounter, durations: RecorderDurations) -> dict:
    return parse(collected(rec, errors, settle=(durations.drain,)))


def test_the_recorders_device_times_time_the_collectives_counted_untimed(world1):
    dist = world1
    dist.all_reduce(torch.ones(2))  # before the exporter: the past, not observed
    rec, errors = Recorder("explicit"), ErrorCounter()
    durations = RecorderDurations(rec, errors, dumps=[timed_like_nccl(0.004)], read_every_s=0)
    wrappers = CollectiveTiming(rec, errors, timed=False)  # as on CUDA
    wrappers.instrument()
    try:
        for _ in range(3):
            dist.all_reduce(torch.ones(4))
        dist.all_gather_single(torch.empty(4), torch.ones(4))
    finally:
        wrappers.uninstrument()
    # gloo's recorder retires an entry from torch's own thread, a moment after the call.
    wait_for(lambda: durations.drain() + durations.observed >= 4, 30, "four durations")
    s = scrape(rec, errors, durations)
    name = "ddp_collective_duration_seconds"
    assert value(s, f"{name}_count", op="allreduce", pg="0") == 3
    assert value(s, f"{name}_sum", op="allreduce", pg="0") == pytest.approx(0.012)
    assert value(s, f"{name}_count", op="allgather", pg="0") == 1
    assert value(s, "ddp_collective_untimed_total", op="allreduce", pg="0") == 0
    assert durations.active and durations.observed == 4
    assert sum(errors.snapshot().values()) == 0


def test_a_duration_never_times_a_collective_the_wrappers_did_not_count(world1):
    dist = world1
    rec, errors = Recorder("explicit"), ErrorCounter()
    durations = RecorderDurations(rec, errors, dumps=[timed_like_nccl(0.002)], read_every_s=0)
    wrappers = CollectiveTiming(rec, errors, timed=False)
    wrappers.instrument()
    try:
        dist.all_reduce(torch.ones(4))
    finally:
        wrappers.uninstrument()
    for _ in range(2):
        dist.all_reduce(torch.ones(4))  # not counted: the wrappers are gone
    dist.broadcast(torch.ones(4), src=0)  # no stats of this op at all
    last = gloo_dump(includeStackTraces=False)["entries"][-1]["record_id"]

    def all_read() -> bool:
        durations.drain()
        return durations.settled[0] >= last  # every entry up to the broadcast settled

    wait_for(all_read, 30, "every entry read")
    (stats,) = rec.collectives
    assert (stats.completed, stats.hist.count, durations.observed) == (1, 1, 1)


def _entry(record_id: int, retired: bool, ms: float | None = None, created_ns: int = 0) -> dict:
    e = {
        "record_id": record_id,
        "process_group": ("tp", "tensor parallel"),
        "profiling_name": "nccl:_allgather_base",
        "retired": retired,
        "is_p2p": False,
        "time_created_ns": created_ns or time.time_ns(),
    }
    if ms is not None:
        e["duration_ms"] = ms
    return e


def test_an_entry_retired_after_a_later_one_is_still_observed():
    # Two groups' streams retire out of order: entry 2 finishes after entry 3.
    rec, errors = Recorder("explicit"), ErrorCounter()
    stats = rec.collective_stats("allgather", "tp", None)
    for _ in range(3):
        rec.collective_finished(stats, rec.collective_launched(stats, 8), timed=False)
    entries = [_entry(1, True, 1.0, created_ns=1)]  # before the exporter: the past
    durations = RecorderDurations(
        rec, errors, dumps=[lambda **kw: {"entries": entries}], read_every_s=0
    )
    entries += [_entry(2, False), _entry(3, True, 3.0)]
    assert durations.drain() == 1  # entry 3
    entries[1] = _entry(2, True, 2.0)
    assert durations.drain() == 1  # entry 2, not skipped; entry 3 not observed twice
    assert durations.drain() == 0
    assert (stats.hist.count, stats.hist.sum) == (2, pytest.approx(0.005))


def test_the_entries_are_read_at_most_once_a_period():
    # A read holds the interpreter for tens of milliseconds: not at every scrape.
    rec, errors = Recorder("explicit"), ErrorCounter()
    stats = rec.collective_stats("allgather", "tp", None)
    reads = []

    def dump(**kwargs):
        reads.append(kwargs)
        return {"entries": [_entry(len(reads), True, 1.0)]}

    durations = RecorderDurations(rec, errors, dumps=[dump], read_every_s=3600)
    for _ in range(2):
        rec.collective_finished(stats, rec.collective_launched(stats, 8), timed=False)
    assert [durations.drain() for _ in range(5)] == [1, 0, 0, 0, 0]
    assert len(reads) == 1 and stats.hist.count == 1


def test_a_recorder_that_times_nothing_is_read_no_more_and_said_once(world1, caplog):
    dist = world1
    caplog.set_level(logging.INFO, logger="exporter")
    rec, errors = Recorder("explicit"), ErrorCounter()
    durations = RecorderDurations(rec, errors, dumps=[gloo_dump], read_every_s=0)  # untimed
    wrappers = CollectiveTiming(rec, errors, timed=False)
    wrappers.instrument()
    try:
        for _ in range(READS_BEFORE_GIVING_UP):
            dist.all_reduce(torch.ones(4))
            before = durations.settled[0]
            wait_for(
                lambda b=before: not durations.drain() and durations.settled[0] > b, 30, "a read"
            )
    finally:
        wrappers.uninstrument()
    assert not durations.active
    said = [r.getMessage() for r in caplog.records if "TORCH_NCCL_ENABLE_TIMING" in r.getMessage()]
    assert len(said) == 1, said
    dist.all_reduce(torch.ones(4))
    assert durations.drain() == 0 and rec.collectives[0].hist.count == 0
