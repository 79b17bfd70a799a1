"""The compute stream's waits for collectives, timed on the device (CUDA without DDP).

CUDA events cannot exist here: an injected event source stands in for them, marks read from a
clock the test moves, completed when the test says so. FSDP2 and the functional collectives are
torch's own, on a real one-rank gloo group.
"""

from __future__ import annotations

import importlib
import threading
import types
from typing import Any

import pytest
import torch
from eventstandin import Events, device_waits
from harness import HandClock as Clock
from harness import wait_for

from exporter.errors import ErrorCounter
from exporter.sources.classicwaits import ClassicFsdpWaitTiming
from exporter.sources.devicewaits import DeviceWaits
from exporter.sources.fsdpwaits import Fsdp2, FsdpWaitTiming, fsdp2_classes
from exporter.sources.functional import FunctionalCollectiveTiming
from exporter.sources.recorder import Recorder

pytestmark = pytest.mark.unit


@pytest.fixture
def device():
    """A recorder whose steps close explicitly, and device waits every 4 steps on its clock."""
    made = device_waits(4)
    yield made
    made[2].close()


@pytest.fixture
def each_step():
    """The same, timing every step's waits."""
    made = device_waits(1)
    yield made
    made[2].close()


def step(rec: Recorder, clock: Clock, waits: DeviceWaits | None = None, wait_s: float = 0.0):
    """One 1 s step whose compute stream waits ``wait_s`` inside it (marked if sampled)."""
    rec.open_step()
    mark = waits.begin() if waits is not None else None
    clock.t += wait_s
    if mark is not None:
        waits.end(mark)
    clock.t += 1.0 - wait_s
    rec.boundary("explicit")


def test_every_nth_steps_waits_count_n_times_in_comm_wait(device):
    rec, errors, waits, clock = device
    for _ in range(8):
        step(rec, clock, waits, wait_s=0.25)
    # Steps 4 and 8 were timed (never the first, which sets communicators up).
    assert len(waits.events.marks) == 4
    assert waits.drain() == 2 and waits.resolved == 2
    _data, compute, comm, _opt = rec.snapshot().phase_sum
    assert comm == pytest.approx(2 * 4 * 0.25) and compute == pytest.approx(8 - 2.0)
    assert not any(errors.snapshot().values())


def test_a_wait_resolves_once_complete_and_never_lowers_the_compute_a_scrape_read(device):
    rec, _errors, waits, clock = device
    for _ in range(3):
        step(rec, clock)
    waits.events.complete = False
    step(rec, clock, waits, wait_s=0.5)
    assert waits.drain() == 0 and rec.snapshot().phase_sum[2] == 0.0
    waits.events.marks[-1].done = True
    assert waits.drain() == 1
    # A scrape read 4 s of compute: the 2 s of waits (4 x 0.5) come out of the next steps'.
    seen = [rec.snapshot().phase_sum]
    for _ in range(3):
        step(rec, clock)
        seen.append(rec.snapshot().phase_sum)
    computes = [s[1] for s in seen]
    assert computes == sorted(computes), computes
    assert [s[2] for s in seen] == pytest.approx([0.0, 1.0, 2.0, 2.0])
    assert computes[-1] == pytest.approx(7 - 2.0)


def test_waits_the_host_never_had_compute_for_are_dropped_not_owed_forever():
    clock = Clock()
    rec = Recorder("explicit", clock=clock)
    step(rec, clock)
    rec.snapshot()
    rec.add_comm_wait(100.0, spread=2)  # far beyond any step's compute
    for _ in range(6):
        step(rec, clock)
    _data, compute, comm, _opt = rec.snapshot().phase_sum
    # Paid by the 4 step closes that follow (twice the spread), then dropped.
    assert comm == pytest.approx(4.0) and compute == pytest.approx(3.0)


def test_waits_inside_a_section_that_interrupts_training_are_not_timed(device):
    rec, _errors, waits, clock = device
    for _ in range(3):
        step(rec, clock)
    rec.open_step()
    rec.section_begin()  # rank 0's evaluation between steps
    assert waits.begin() is None and waits.events.marks == []
    rec.section_end()
    assert waits.begin() is not None


def test_a_wait_read_before_its_step_closes_moves_once_there_is_compute():
    clock = Clock()
    rec = Recorder("explicit", clock=clock)
    waits = DeviceWaits(rec, ErrorCounter(), every=1, events=Events(clock), interval_s=3600)
    try:
        rec.open_step()
        mark = waits.begin()
        clock.t += 0.25
        waits.end(mark)
        assert waits.drain() == 1 and rec.snapshot().phase_sum[2] == 0.0  # no compute yet
        clock.t += 0.75
        rec.boundary("explicit")
        waits.drain()
        _data, compute, comm, _opt = rec.snapshot().phase_sum
        assert comm == pytest.approx(0.25) and compute == pytest.approx(0.75)
    finally:
        waits.close()


def test_nothing_is_marked_during_graph_capture_and_errors_never_reach_training(device):
    rec, errors, waits, clock = device
    for _ in range(3):
        step(rec, clock)
    waits.events.capturing = True
    assert waits.begin() is None and waits.events.marks == []
    waits.events.capturing = False
    waits.events.fail = RuntimeError("no event")
    assert waits.begin() is None
    waits.end(object())
    assert errors.snapshot()["comm_timing"] == 2
    waits.events.fail = None
    waits.end(object())  # a mark the source cannot read: dropped, counted
    assert waits.drain() == 0 and errors.snapshot()["comm_timing"] == 3


def test_the_thread_resolves_and_close_stops_it():
    clock = Clock()
    rec = Recorder("explicit", clock=clock)
    waits = DeviceWaits(rec, ErrorCounter(), every=1, events=Events(clock), interval_s=0.01)
    step(rec, clock, waits, wait_s=0.5)
    wait_for(lambda: waits.resolved == 1, 10, "the thread to resolve the wait")
    waits.close()
    assert not any(t.name == "ddp-exporter-device-waits" for t in threading.enumerate())


def test_every_below_one_is_refused():
    with pytest.raises(ValueError, match="every"):
        DeviceWaits(Recorder("explicit"), ErrorCounter(), every=0)


class Result:
    def __init__(self, event=None, work=None) -> None:
        self.all_gather_event, self.all_gather_work = event, work


def stand_ins(log: list[str]) -> Fsdp2:
    """FSDP2 as far as the part uses it, logging what runs on the compute stream."""
    reducing = types.SimpleNamespace()

    def foreach_reduce() -> None:
        log.append("copy-in, reduce-scatter issued")

    reducing.foreach_reduce = foreach_reduce

    class Group:
        _all_gather_result: Result | None = None
        fsdp_params: tuple = ()
        reduces = True

        def wait_for_unshard(self) -> str:
            log.append("fsdp waits and copies out")
            return "unsharded"

        def post_backward(self) -> None:
            log.append("waits for the reduce-scatter before")
            if self.reduces:  # not on a micro-batch that only accumulates
                reducing.foreach_reduce()  # looked up in its module at call time, as FSDP2 does

    class State:
        def _root_post_backward_final_callback(self) -> None:
            log.append("waits")
            Group().post_backward()  # a group whose inputs needed no gradient
            log.append("waits for its reductions")

    return Fsdp2(Group, State, reducing)


def logging_marks(waits: DeviceWaits, log: list[str]) -> None:
    events = waits.events
    events.wait = lambda event: log.append(f"marked wait for {event}")
    real_record = events.record
    events.record = lambda: (log.append("mark"), real_record())[1]


def test_fsdp2s_waits_are_marked_apart_from_the_compute_around_them(device):
    rec, _errors, waits, clock = device
    for _ in range(3):
        step(rec, clock)
    log: list[str] = []
    fsdp2 = stand_ins(log)
    logging_marks(waits, log)
    part = FsdpWaitTiming(waits, fsdp2)
    originals = dict(vars(fsdp2.group)), dict(vars(fsdp2.reducing))
    assert part.instrument() and part.instrument()
    group = fsdp2.group()
    assert group.wait_for_unshard() == "unsharded"  # nothing gathered: nothing marked
    group._all_gather_result = Result(event="ag")
    assert group.wait_for_unshard() == "unsharded"
    # Asynchronous: FSDP2 records its event on the current stream too; the work is the wait.
    group._all_gather_result = Result(event="not the gather", work="work")
    group.wait_for_unshard()
    assert log == [
        "fsdp waits and copies out",
        "mark",
        "marked wait for ag",
        "mark",
        "fsdp waits and copies out",
        "mark",  # asynchronous work: its wait is inside, no wait on its event
        "fsdp waits and copies out",
        "mark",
    ]
    log.clear()
    group.post_backward()
    fsdp2.state()._root_post_backward_final_callback()
    assert log == [
        "mark",
        "waits for the reduce-scatter before",
        "mark",  # before the copy-in
        "copy-in, reduce-scatter issued",
        "mark",  # the tail
        "waits",
        "waits for the reduce-scatter before",
        "mark",  # the late group's copy-in is not the tail's wait ...
        "copy-in, reduce-scatter issued",
        "mark",  # ... which goes on after it
        "waits for its reductions",
        "mark",
    ]
    assert len(waits.events.marks) % 2 == 0
    part.uninstrument()
    part.uninstrument()
    assert (dict(vars(fsdp2.group)), dict(vars(fsdp2.reducing))) == originals


def test_fsdp2_accumulating_gradients_and_unmarked_steps_call_straight_through(device):
    rec, _errors, waits, clock = device
    log: list[str] = []
    fsdp2 = stand_ins(log)
    part = FsdpWaitTiming(waits, fsdp2)
    part.instrument()
    group = fsdp2.group()
    group._all_gather_result = Result(event="ag")
    group.wait_for_unshard()  # step 1 of 4: not timed
    group.post_backward()
    assert waits.events.marks == []
    for _ in range(3):
        step(rec, clock)
    group.fsdp_params = (types.SimpleNamespace(unsharded_accumulated_grad=torch.ones(1)),)
    group.post_backward()  # sums run on the stream there: not a wait
    assert waits.events.marks == []
    group.fsdp_params, group.reduces = (), False
    group.post_backward()  # a micro-batch whose gradients wait for the next backward
    assert len(waits.events.marks) == 1
    assert waits.begin() is not None, "the mark given up must leave the thread free to mark"
    later = fsdp2.group.wait_for_unshard
    fsdp2.group.wait_for_unshard = lambda self: later(self)
    mine = fsdp2.group.wait_for_unshard
    part.uninstrument()
    assert fsdp2.group.__dict__["wait_for_unshard"] is mine


def test_real_fsdp2_is_found_marked_and_restored(world1, each_step):
    from torch.distributed.fsdp import fully_shard

    fsdp2 = fsdp2_classes()
    assert fsdp2 is not None and fsdp2.reducing is not None, "this torch's FSDP2 must be found"
    names = ("wait_for_unshard", "post_backward", "_root_post_backward_final_callback")
    before = [vars(fsdp2.group).get(n) or vars(fsdp2.state).get(n) for n in names]
    before.append(fsdp2.reducing.foreach_reduce)
    rec, errors, waits, clock = each_step
    part = FsdpWaitTiming(waits)
    try:
        assert part.instrument()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        for _ in range(3):
            rec.open_step()
            model(torch.ones(2, 4)).sum().backward()
            rec.boundary("explicit")
        # One rank gathers nothing. Per backward: the second layer's wait before its reduce,
        # and the tail, cut by the first layer's reduce (its input needs no gradient).
        assert len(waits.events.marks) == 3 * 2 * 3
        assert waits.drain() == 3 * 3 and not any(errors.snapshot().values())
        # What the all-gather wrapper reads, by this torch's names (one rank never fills it).
        package = fsdp2.group.__module__.rsplit(".", 1)[0]
        result = importlib.import_module(f"{package}._fsdp_collectives").AllGatherResult
        assert {"all_gather_event", "all_gather_work"} <= set(result._fields)
        assert hasattr(model[0]._get_fsdp_state()._fsdp_param_group, "_all_gather_result")
    finally:
        part.uninstrument()
    after = [vars(fsdp2.group).get(n) or vars(fsdp2.state).get(n) for n in names]
    after.append(fsdp2.reducing.foreach_reduce)
    assert after == before


def test_a_functional_wait_is_marked_only_where_the_host_does_not_time_it(world1, each_step):
    import torch.distributed._functional_collectives as funcol

    rec, errors, waits, clock = each_step
    untimed = FunctionalCollectiveTiming(rec, errors, timed=False, device=waits)
    try:
        assert untimed.instrument()
        funcol.all_reduce(torch.ones(4), "sum", "0").wait()
        assert len(waits.events.marks) == 2
    finally:
        untimed.uninstrument()
    timed = FunctionalCollectiveTiming(rec, errors, timed=True, device=waits)
    try:
        assert timed.instrument()
        funcol.all_reduce(torch.ones(4), "sum", "0").wait()
        assert len(waits.events.marks) == 2  # the host times it: no device marks
    finally:
        timed.uninstrument()
    assert not any(errors.snapshot().values())


@pytest.mark.parametrize(
    ("cuda", "every", "device"), [(True, 8, True), (True, 0, False), (False, 8, False)]
)
def test_only_a_cuda_rank_without_ddp_times_its_waits_on_the_device(world1, cuda, every, device):
    from exporter.sources.commtiming import start_comm_timing

    rec, errors = Recorder("optimizer"), ErrorCounter()
    timing = start_comm_timing(
        None, "fsdp2", rec, errors, requested="auto", inflight="none", cuda=cuda, device_every=every
    )
    try:
        assert timing.mode == "collectives"
        assert isinstance(timing.device, DeviceWaits) is device
        parts = [type(p) for p in timing.instrumentor.parts]
        assert (FsdpWaitTiming in parts) is device
        assert (ClassicFsdpWaitTiming in parts) is device
        if device:
            assert timing.device.every == every
            assert timing.device.drain in timing.settlers()
            assert timing.threads() == [timing.device]
    finally:
        timing.instrumentor.uninstrument()
        for thread in timing.threads():
            thread.close()


def test_a_wait_inside_a_marked_wait_is_not_marked_again(device):
    rec, _errors, waits, clock = device
    for _ in range(3):
        step(rec, clock)
    outer = waits.begin()
    assert outer is not None and waits.begin() is None  # FSDP2's unshard waits on its work
    waits.end(outer)
    inner = waits.begin()
    assert inner is not None
    waits.drop(inner)  # given up: the thread may mark again, nothing was timed
    assert waits.begin() is not None
    elsewhere: list[object] = []
    thread = threading.Thread(target=lambda: elsewhere.append(waits.begin()))
    thread.start()
    thread.join()
    assert elsewhere[0] is not None  # another thread's wait is its own
    assert len(waits.events.marks) == 5


def test_work_wait_is_marked_on_the_default_stream_of_a_plain_loop(world1, each_step):
    from exporter.sources.collectives import CollectiveTiming

    dist = world1
    rec, errors, waits, clock = each_step
    wrappers = CollectiveTiming(rec, errors, timed=False, device=waits)
    try:
        assert wrappers.instrument()
        dist.all_reduce(torch.ones(4))  # synchronous: torch waits with Work.wait()
        dist.all_reduce(torch.ones(4), async_op=True).wait()
        assert len(waits.events.marks) == 4
        waits.events.default = False  # a stream of FSDP's own waits, not the compute stream
        dist.all_reduce(torch.ones(4))
        assert len(waits.events.marks) == 4
        waits.events.default = True
        outer = waits.begin()  # inside a wait FSDP2's part marks: counted once
        dist.all_reduce(torch.ones(4))
        waits.end(outer)
        assert len(waits.events.marks) == 6
        assert waits.drain() == 3 and not any(errors.snapshot().values())
    finally:
        wrappers.uninstrument()
    timed = CollectiveTiming(rec, errors, timed=True, device=waits)
    try:
        assert timed.instrument()
        dist.all_reduce(torch.ones(4))
        assert len(waits.events.marks) == 6  # the host times it: no device marks
    finally:
        timed.uninstrument()


def drained_comm_wait(rec: Recorder, waits: DeviceWaits, clock: Clock) -> tuple[int, float]:
    """Close the open step a second later; return the waits drained and the step's comm_wait."""
    clock.t += 1.0
    rec.boundary("explicit")
    return waits.drain(), rec.snapshot().phase_sum[2]


def nccl_like(clock: Clock, in_call_s: float) -> types.SimpleNamespace:
    """A namespace whose ``all_reduce`` behaves as NCCL's does: a synchronous call runs on the
    caller's stream (the device spends ``in_call_s`` in it) and returns no Work to wait for."""

    def all_reduce(tensor, op=None, group=None, async_op=False):
        if async_op:
            return torch.distributed.all_reduce(tensor, async_op=True)
        clock.t += in_call_s
        return None

    return types.SimpleNamespace(all_reduce=all_reduce)


def sync_marks(part: str, each_step: tuple, **namespace: Any) -> Any:
    """Return what marks a synchronous collective: the loop wrappers (``collectives``: every
    collective counted, none timed by the host) or, beside DDP, the step's own collectives'
    marks (counted nowhere)."""
    from exporter.sources.collectives import CollectiveTiming
    from exporter.sources.syncmarks import SyncCollectiveMarks

    rec, errors, waits, _clock = each_step
    if part == "collectives":
        return CollectiveTiming(rec, errors, timed=False, device=waits, **namespace)
    return SyncCollectiveMarks(waits, **namespace)


@pytest.mark.parametrize("part", ["collectives", "beside_ddp"])
def test_a_synchronous_collective_without_a_work_is_timed_on_the_device(world1, each_step, part):
    rec, errors, waits, clock = each_step
    ns = nccl_like(clock, 0.25)
    wrappers = sync_marks(part, each_step, namespace=ns)
    original = ns.all_reduce
    try:
        assert wrappers.instrument() and wrappers.instrument()
        rec.open_step()
        ns.all_reduce(torch.ones(4))  # a loss all-reduced for logging
        assert len(waits.events.marks) == 2
        ns.all_reduce(torch.ones(4), None, None, True)  # asynchronous: its Work.wait() marks
        assert len(waits.events.marks) == 2
        waits.events.default = False  # on a stream of FSDP's own: not the compute stream
        ns.all_reduce(torch.ones(4))
        waits.events.default = True
        assert len(waits.events.marks) == 2
        # What the compute stream spent in the collective is comm_wait, not compute.
        assert drained_comm_wait(rec, waits, clock) == (1, pytest.approx(0.25))
    finally:
        wrappers.uninstrument()
    assert ns.all_reduce is original
    assert not any(errors.snapshot().values())


@pytest.mark.parametrize("part", ["collectives", "beside_ddp"])
def test_a_collective_a_coalescing_manager_queues_is_neither_marked_nor_counted(
    world1, each_step, part
):
    """Inside torch's coalescing manager a synchronous collective only queues its op and
    returns: no empty interval is marked for it, nothing is counted or left in flight. The
    manager issues one coalesced collective at its exit and waits for its Work, which the loop
    wrappers mark and count, untimed as every collective on a GPU (beside DDP, the Work.wait()
    wrapper of DDP's own part marks it)."""
    dist = world1
    if not hasattr(dist.distributed_c10d, "_coalescing_manager"):  # private
        pytest.skip("this torch has no coalescing manager")
    rec, errors, waits, _clock = each_step
    wrappers = sync_marks(part, each_step)
    a, b = torch.ones(3), torch.ones(2)
    try:
        assert wrappers.instrument()
        rec.open_step()
        # Looked up at each use, as DeepSpeed does; nothing raised inside: torch would keep
        # the queue for the next one.
        with dist.distributed_c10d._coalescing_manager():
            returned = [dist.all_reduce(a), dist.all_reduce(b)]
            queued = len(waits.events.marks)
        marked = len(waits.events.marks)
    finally:
        wrappers.uninstrument()
    assert returned == [None, None] and queued == 0
    assert marked == (2 if part == "collectives" else 0)
    assert a.tolist() == [1.0] * 3 and b.tolist() == [1.0] * 2
    counted = [(s.op, s.enqueued, s.completed, s.hist.count) for s in rec.collectives]
    assert counted == ([("allreduce", 1, 1, 0)] if part == "collectives" else [])
    assert all(n == done for _pg, n, done, _age in rec.inflight())
    assert not any(errors.snapshot().values())


class Stalled(torch.autograd.Function):
    """Waits for a collective in its backward, as SyncBatchNorm does."""

    @staticmethod
    def forward(ctx, x, work):
        ctx.work = work
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.work.wait()
        return grad, None


def test_a_gpus_work_waits_are_timed_on_the_device_where_the_compute_stream_waits(each_step):
    from exporter.sources.waits import WaitTiming

    rec, errors, waits, clock = each_step
    marks = waits.events.marks

    class Work:
        def wait(self) -> None:
            clock.t += 0.5  # the host inside the wait, which only orders streams on a GPU

    def stream_waited(seconds: float) -> None:
        marks[-1].t = marks[-2].t + seconds

    part = WaitTiming(rec, errors, work_class=Work, device=waits)
    try:
        assert part.instrument()
        rec.open_step()
        Work().wait()  # a logged loss, on the training thread
        stream_waited(0.125)
        x = torch.ones(2, requires_grad=True)
        backward = threading.Thread(target=lambda: Stalled.apply(x, Work()).sum().backward())
        backward.start()  # SyncBatchNorm's backward, on whichever thread runs it
        backward.join()
        stream_waited(0.125)
        assert len(marks) == 4
        saver = threading.Thread(target=Work().wait)
        saver.start()  # a checkpoint's thread: the training thread queues compute meanwhile
        saver.join()
        assert len(marks) == 4
        # What the stream waited, not the host's 1.5 s inside the waits.
        assert drained_comm_wait(rec, waits, clock) == (2, pytest.approx(0.25))
    finally:
        part.uninstrument()
    assert not any(errors.snapshot().values())


def test_a_cuda_ddp_rank_times_its_own_steps_waits_on_the_device(world1):
    from exporter.sources.commtiming import start_comm_timing
    from exporter.sources.syncmarks import SyncCollectiveMarks
    from exporter.sources.waits import WaitTiming

    all_reduce = torch.distributed.all_reduce
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    rec, errors = Recorder("optimizer"), ErrorCounter()
    timing = start_comm_timing(
        model, "ddp", rec, errors, requested="hook", inflight="none", cuda=True, device_every=8
    )
    try:
        assert timing.mode == "hook" and isinstance(timing.device, DeviceWaits)
        assert {WaitTiming, SyncCollectiveMarks} <= {type(p) for p in timing.instrumentor.parts}
        assert torch.distributed.all_reduce is not all_reduce
        assert timing.device.drain in timing.settlers()
        assert timing.device in timing.threads() and timing.resolver in timing.threads()
    finally:
        timing.instrumentor.uninstrument()
        for thread in timing.threads():
            thread.close()
    assert torch.distributed.all_reduce is all_reduce


def test_a_timing_mode_that_cannot_work_raises_before_anything_is_started(world1):
    from exporter.sources.commtiming import start_comm_timing

    wait = vars(world1.Work).get("wait")
    with pytest.raises(ValueError, match="comm_timing='events'"):
        start_comm_timing(
            torch.nn.Linear(1, 1),
            "ddp",
            Recorder("optimizer"),
            ErrorCounter(),
            requested="events",
            inflight="flight_recorder",
            cuda=True,
            device_every=8,
        )
    assert vars(world1.Work).get("wait") is wait
    assert not any(t.name == "ddp-exporter-device-waits" for t in threading.enumerate())
