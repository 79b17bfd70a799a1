"""The functional collectives' timing (DTensor's communication) in a real one-rank gloo group.

A one-rank DeviceMesh issues no collective (DTensor skips them), so these tests call the
functional collectives themselves, as DTensor does; tests/test_tensor_parallel.py runs DTensor
on real meshes. Waits that must take time are a stand-in namespace's, with torch's signatures.
"""

from __future__ import annotations

import threading
import time
import types

import pytest
import torch

import exporter
from exporter.errors import ErrorCounter
from exporter.sources.functional import FUNCTIONAL_OPS, FunctionalCollectiveTiming
from exporter.sources.recorder import Recorder

pytestmark = pytest.mark.unit

NS = torch.ops._c10d_functional


def stats_of(rec: Recorder) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Return ``(op, pg) -> (called, completed, timed)``."""
    return {(s.op, s.pg): (s.enqueued, s.completed, s.hist.count) for s in rec.collectives}


def timing(namespace=None) -> tuple[Recorder, ErrorCounter, FunctionalCollectiveTiming]:
    rec = Recorder("explicit")
    rec.time_comm_by_waits()
    errors = ErrorCounter()
    ft = FunctionalCollectiveTiming(
        rec, errors, namespace=namespace, training_thread=threading.get_ident()
    )
    return rec, errors, ft


class Packet:
    """A stand-in op with a real op's schema; ``fn`` does the work."""

    def __init__(self, real, fn) -> None:
        self.default, self.fn = real.default, fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def test_replaces_the_ops_and_restores_exactly(world1):
    import torch.distributed._functional_collectives as funcol

    before = {name: getattr(NS, name) for name in (*FUNCTIONAL_OPS, "wait_tensor")}
    rec, errors, ft = timing()
    assert ft.instrument() and ft.instrument()  # idempotent
    assert NS.all_reduce is not before["all_reduce"]
    # Everything but the call is torch's own: overloads, their identity, the repr.
    assert NS.all_reduce.default is before["all_reduce"].default
    assert NS.wait_tensor.overloads() == before["wait_tensor"].overloads()
    assert repr(NS.all_reduce) == repr(before["all_reduce"])
    out = funcol.all_reduce(torch.ones(4), "sum", "0")
    assert type(out).__name__ == "AsyncCollectiveTensor"
    assert torch.equal(out + 0, torch.ones(4))  # first use waits, through the stand-in
    ft.uninstrument()
    ft.uninstrument()
    assert {name: getattr(NS, name) for name in before} == before
    assert stats_of(rec) == {("allreduce", "0"): (1, 1, 1)}
    assert sum(errors.snapshot().values()) == 0


def test_leaves_a_replacement_made_after_it(world1):
    rec, _, ft = timing()
    original = NS.all_reduce
    ft.instrument()
    theirs = object()
    NS.all_reduce = theirs
    try:
        ft.uninstrument()
        assert NS.all_reduce is theirs
    finally:
        NS.all_reduce = original


def test_every_kind_counted_once_and_waits_matched_through_views(world1):
    import torch.distributed._functional_collectives as funcol

    rec, errors, ft = timing()
    ft.instrument()
    try:
        rec.open_step()
        gathered = funcol.all_gather_single(torch.ones(3, 2), 0, "0")
        assert torch.equal(gathered.view(-1)[1:] + 0, torch.ones(5))  # waited through a view
        scattered = funcol.reduce_scatter_single(torch.ones(4), "sum", 0, "0")
        assert torch.equal(scattered.wait(), torch.ones(4))
        pair = funcol.all_reduce_coalesced([torch.ones(2), torch.ones(3)], "sum", "0")
        assert [t.sum().item() for t in pair] == [2.0, 3.0]  # one collective, two waits
        assert torch.equal(funcol.broadcast(torch.ones(2), 0, "0").wait(), torch.ones(2))
        # The deprecated alias calls the function it names: one collective, not two.
        with pytest.warns(FutureWarning):
            assert torch.equal(
                funcol.all_gather_tensor(torch.ones(2), 0, "0").wait(), torch.ones(2)
            )
        rec.boundary("explicit")
    finally:
        ft.uninstrument()
    assert stats_of(rec) == {
        ("allgather", "0"): (2, 2, 2),
        ("reduce_scatter", "0"): (1, 1, 1),
        ("allreduce", "0"): (1, 1, 1),
        ("broadcast", "0"): (1, 1, 1),
    }
    bytes_of = {(s.op, s.pg): s.bytes for s in rec.collectives}
    assert bytes_of[("allreduce", "0")] == 20 and bytes_of[("allgather", "0")] == 24 + 8
    assert not ft._pending and sum(errors.snapshot().values()) == 0


def test_the_wait_is_comm_wait_and_ends_the_latency():
    """A wait on the training thread moves its time from compute to comm_wait, also inside
    optimizer.step(); a wait on another thread does not."""
    waits: list[float] = []

    def wait(t):
        time.sleep(waits.pop(0))
        return t

    ns = types.SimpleNamespace(
        all_reduce=Packet(NS.all_reduce, lambda t, op, group: t.clone()),
        wait_tensor=Packet(NS.wait_tensor, wait),
    )
    rec, _, ft = timing(ns)
    assert ft.instrument()
    rec.open_step()
    # The other thread's wait is long enough that counting it could not pass for slow sleeps.
    waits[:] = [0.05, 0.03, 0.5]
    out = ns.all_reduce(torch.ones(2), "sum", "7")
    ns.wait_tensor(out)  # in the step: comm_wait
    rec.optimizer_begin()
    ns.wait_tensor(ns.all_reduce(torch.ones(2), "sum", "7"))  # inside optimizer.step()
    rec.optimizer_end()
    rec.open_step()
    other = threading.Thread(
        target=lambda: ns.wait_tensor(ns.all_reduce(torch.ones(2), "sum", "7"))
    )
    other.start()
    other.join()
    rec.boundary("explicit")
    data, compute, comm, opt = rec.phase_sum
    assert 0.08 <= comm < 0.5, rec.phase_sum  # the other thread's 0.5 s is not this step's
    assert opt < 0.01, rec.phase_sum  # the wait inside the optimizer is not optimizer time
    (st,) = rec.collectives
    assert (st.op, st.pg, st.enqueued, st.hist.count) == ("allreduce", "7", 3, 3)
    assert st.hist.sum >= 0.58


def test_untimed_when_never_waited_or_waited_out_of_sight(world1, monkeypatch):
    """A launch whose output is freed unwaited and its storage reused, or beyond the bound, is
    counted untimed (and no longer in flight)."""
    import exporter.sources.functional as functional

    monkeypatch.setattr(functional, "MAX_UNWAITED", 4)
    out = torch.ones(2)
    ns = types.SimpleNamespace(
        all_reduce=Packet(NS.all_reduce, lambda t, op, group: out),  # the same storage each time
        all_gather_into_tensor=Packet(
            NS.all_gather_into_tensor, lambda t, size, group: torch.ones(2)
        ),
        wait_tensor=Packet(NS.wait_tensor, lambda t: t),
    )
    rec, _, ft = timing(ns)
    ft.instrument()
    ns.all_reduce(torch.ones(2), "sum", "0")
    ns.all_reduce(torch.ones(2), "sum", "0")  # the first one's storage again: it was not waited
    kept = [ns.all_gather_into_tensor(torch.ones(2), 1, "0") for _ in range(6)]
    # The second all-reduce reused the first's storage: the first was never waited for. Past
    # the bound the oldest launches are forgotten: the second all-reduce, two all-gathers.
    assert len(ft._pending) == 4
    s = {(st.op, st.pg): st for st in rec.collectives}
    assert (s[("allreduce", "0")].completed, s[("allreduce", "0")].hist.count) == (2, 0)
    assert (s[("allgather", "0")].completed, len(s[("allgather", "0")].pending)) == (2, 4)
    assert rec.snapshot().untimed == [("allreduce", "0", 2), ("allgather", "0", 2)]
    del kept


def test_an_exporter_error_never_reaches_the_collective(world1):
    import torch.distributed._functional_collectives as funcol

    rec, errors, ft = timing()

    def broken(*args, **kwargs):
        raise RuntimeError("bookkeeping broke")

    rec.collective_launched = broken  # type: ignore[method-assign]
    rec.collective_waited = broken  # type: ignore[method-assign]
    ft.instrument()
    try:
        out = funcol.all_reduce(torch.ones(3), "sum", "0")
        assert torch.equal(out.wait(), torch.ones(3))
    finally:
        ft.uninstrument()
    assert errors.snapshot()["comm_timing"] == 2


def test_torch_compile_traces_through_the_stand_ins(world1):
    import torch.distributed._functional_collectives as funcol

    def f(x):
        return funcol.all_reduce(x * 2, "sum", "0") + 1

    rec, errors, ft = timing()
    ft.instrument()
    try:
        torch._dynamo.reset()
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
        assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    finally:
        ft.uninstrument()
        torch._dynamo.reset()
    assert sum(errors.snapshot().values()) == 0


def test_instrument_times_functional_collectives_with_any_parallelism(ddp):
    """A DDP job's functional collectives too (a metric's DTensor, a loss reduced with them)."""
    import torch.distributed._functional_collectives as funcol

    model, loader, opt = ddp
    original = NS.wait_tensor
    obs = exporter.instrument(model, port=0, addr="127.0.0.1", heartbeat_s=0, optimizer=opt)
    try:
        assert NS.wait_tensor is not original
        funcol.all_reduce(torch.ones(2), "sum", "0").wait()
        ops = {(s.op, s.pg): s.hist.count for s in obs.recorder.collectives}
        assert ops[("allreduce", "0")] >= 1
    finally:
        obs.close()
    assert NS.wait_tensor is original


def test_a_torch_without_them_or_a_changed_api_falls_back_cleanly():
    """No wait_tensor: nothing replaced, one line. A replacement that fails: what was replaced
    is restored, the error counted."""
    rec, errors, ft = timing(types.SimpleNamespace(all_reduce=NS.all_reduce))
    assert not ft.instrument() and not ft.instrument()
    assert sum(errors.snapshot().values()) == 0

    class Frozen(types.SimpleNamespace):
        def __setattr__(self, name, value):
            if name == "all_gather_into_tensor":
                raise TypeError("read-only")
            super().__setattr__(name, value)

    wait, reduce = Packet(NS.wait_tensor, lambda t: t), Packet(NS.all_reduce, lambda *a: a[0])
    ns = Frozen(
        wait_tensor=wait, all_reduce=reduce, all_gather_into_tensor=NS.all_gather_into_tensor
    )
    rec, errors, ft = timing(ns)
    assert not ft.instrument()
    assert (ns.wait_tensor, ns.all_reduce) == (wait, reduce)
    assert errors.snapshot()["comm_timing"] == 1
