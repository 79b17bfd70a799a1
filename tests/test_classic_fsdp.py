"""Classic FSDP (``FullyShardedDataParallel``): a job watched, and its waits marked on a GPU.

A classic FSDP job on gloo under torchrun: its straggler named by compute, its collectives
counted. Stand-in events (tests/eventstandin.py) mark where the compute stream would wait on a
GPU: before each module's forward and backward (its all-gather) and at the end of backward (the
gradient reductions). FSDP is torch's own, on a real one-rank gloo group; stand-in modules give
the cases a one-rank group cannot reach.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from eventstandin import device_waits
from harness import Job, top_accuses, value, wait_for

from exporter.sources.classicwaits import ClassicFsdp, ClassicFsdpWaitTiming, classic_fsdp

NAMES = (
    "_pre_forward_unshard",
    "_pre_backward_hook",
    "_post_backward_final_callback",
    "_prefetch_handle",
    "_catch_all_reshard",
)


@pytest.fixture
def each_step():
    """Device waits timing every step's waits, on stand-in events."""
    made = device_waits(1)
    yield made
    made[2].close()


def stand_ins(log: list[str], closing: bool = True) -> ClassicFsdp:
    """Classic FSDP's two modules as far as the part uses them, logging each call.

    Each function waits, then calls on as FSDP does, looking its callee up in the module at
    call time: the prefetch of the next all-gather, the first module's reshard at the end of
    backward. ``closing``: False for a torch without those callees.
    """
    runtime = types.SimpleNamespace()

    def call(name: str) -> None:
        if closing:
            getattr(runtime, name)()
        log.append(f"then {name.strip('_')}'s work")

    def unshard(state, handle):
        log.append("forward waits")
        call("_prefetch_handle")

    def pre_backward(state, module, handle, grad, *unused):
        log.append("backward waits")
        call("_prefetch_handle")
        return grad

    def tail(state, module):
        log.append("tail waits")
        call("_catch_all_reshard")

    runtime._pre_forward_unshard, runtime._pre_backward_hook = unshard, pre_backward
    runtime._post_backward_final_callback = tail
    if closing:
        runtime._prefetch_handle = lambda: log.append("prefetch")
        runtime._catch_all_reshard = lambda: log.append("reshard")
    return ClassicFsdp(runtime, types.SimpleNamespace(_pre_forward_unshard=unshard))


def logging_marks(waits, log: list[str]) -> None:
    real_record = waits.events.record
    waits.events.record = lambda: (log.append("mark"), real_record())[1]


def handle(**flags) -> types.SimpleNamespace:
    return types.SimpleNamespace(**flags)


@pytest.mark.unit
def test_each_wait_is_marked_until_fsdp_moves_on_only_where_fsdp_waits(each_step):
    rec, errors, waits, _clock = each_step
    log: list[str] = []
    fsdp = stand_ins(log)
    originals = dict(vars(fsdp.runtime)), dict(vars(fsdp.front))
    logging_marks(waits, log)
    part = ClassicFsdpWaitTiming(waits, fsdp)
    assert part.instrument() and part.instrument()
    state, synced = types.SimpleNamespace(), types.SimpleNamespace(_sync_gradients=True)
    rec.open_step()
    fsdp.front._pre_forward_unshard(state, handle())
    log.append("|")
    fsdp.runtime._pre_forward_unshard(state, None)  # a module without parameters
    log.append("|")
    gathers = handle(_needs_pre_backward_unshard=True, _ran_pre_backward_hook=False)
    assert fsdp.runtime._pre_backward_hook(state, None, gathers, "grad") == "grad"
    log.append("|")
    fsdp.runtime._pre_backward_hook(state, None, handle(_ran_pre_backward_hook=True), "g")
    fsdp.runtime._pre_backward_hook(state, None, handle(_needs_pre_backward_unshard=False), "g")
    fsdp.runtime._pre_backward_hook(state, None, None, "g")
    log.append("|")
    fsdp.runtime._pre_backward_hook(state, None, handle(), "g")  # a later torch's handle: marked
    log.append("|")
    fsdp.runtime._post_backward_final_callback(synced, None)
    log.append("|")
    fsdp.runtime._post_backward_final_callback(types.SimpleNamespace(_sync_gradients=False), None)
    forward = ["forward waits", "prefetch", "then prefetch_handle's work"]
    backward = ["backward waits", "prefetch", "then prefetch_handle's work"]
    assert log == [
        *("mark", "forward waits", "mark", *forward[1:], "|"),
        *(*forward, "|"),
        *("mark", "backward waits", "mark", *backward[1:], "|"),
        *backward * 3,
        "|",
        *("mark", "backward waits", "mark", *backward[1:], "|"),
        *("mark", "tail waits", "mark", "reshard", "then catch_all_reshard's work", "|"),
        *("tail waits", "reshard", "then catch_all_reshard's work"),  # no_sync: no reduction
    ]
    assert waits.drain() == 4 and not any(errors.snapshot().values())
    part.uninstrument()
    part.uninstrument()
    assert (dict(vars(fsdp.runtime)), dict(vars(fsdp.front))) == originals


@pytest.mark.unit
def test_without_the_calls_that_follow_a_wait_its_function_is_marked_whole(each_step):
    rec, errors, waits, _clock = each_step
    log: list[str] = []
    fsdp = stand_ins(log, closing=False)
    logging_marks(waits, log)
    part = ClassicFsdpWaitTiming(waits, fsdp)
    part.instrument()
    rec.open_step()
    fsdp.front._pre_forward_unshard(None, handle())
    fsdp.runtime._post_backward_final_callback(types.SimpleNamespace(), None)
    assert log == [
        *("mark", "forward waits", "then prefetch_handle's work", "mark"),
        *("mark", "tail waits", "then catch_all_reshard's work", "mark"),
    ]
    part.uninstrument()
    assert waits.drain() == 2 and not any(errors.snapshot().values())


@pytest.mark.unit
def test_a_wait_that_raises_closes_its_mark_and_raises(each_step):
    rec, errors, waits, _clock = each_step
    fsdp = stand_ins([])

    def broken(state, handle):
        raise RuntimeError("FSDP's own error")

    fsdp.front._pre_forward_unshard = broken
    part = ClassicFsdpWaitTiming(waits, fsdp)
    part.instrument()
    rec.open_step()
    with pytest.raises(RuntimeError, match="FSDP's own error"):
        fsdp.front._pre_forward_unshard(None, handle())
    assert len(waits.events.marks) == 2
    fsdp.runtime._pre_forward_unshard(None, handle())  # the thread marks again
    assert len(waits.events.marks) == 4 and not any(errors.snapshot().values())
    part.uninstrument()


@pytest.mark.unit
def test_a_hook_bound_before_uninstrument_calls_straight_through(each_step):
    rec, errors, waits, _clock = each_step
    log: list[str] = []
    fsdp = stand_ins(log)
    part = ClassicFsdpWaitTiming(waits, fsdp)
    part.instrument()
    rec.open_step()
    # FSDP binds the hook into a partial at each forward, before the backward runs it.
    bound = fsdp.runtime._pre_backward_hook
    tail = fsdp.runtime._post_backward_final_callback
    part.uninstrument()
    bound(None, None, handle(), "grad")
    tail(types.SimpleNamespace(), None)
    assert [entry for entry in log if "waits" in entry] == ["backward waits", "tail waits"]
    assert waits.events.marks == []
    # A precondition that cannot be read is no wait, never an error in FSDP's way.
    part.instrument()

    class Unreadable:
        def __bool__(self) -> bool:
            raise RuntimeError("no")

    fsdp.front._pre_forward_unshard(None, Unreadable())
    assert waits.events.marks == [] and not any(errors.snapshot().values())
    later = fsdp.runtime._pre_backward_hook
    fsdp.runtime._pre_backward_hook = lambda *a: later(*a)
    mine = fsdp.runtime._pre_backward_hook
    part.uninstrument()
    assert fsdp.runtime._pre_backward_hook is mine, "someone else's wrapper is left in place"


@pytest.mark.unit
def test_real_classic_fsdp_is_found_marked_restored_and_trains_the_same(world1, each_step):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    fsdp = classic_fsdp()
    assert fsdp is not None, "this torch's classic FSDP must be found"
    before = [getattr(fsdp.runtime, n) for n in NAMES] + [fsdp.front._pre_forward_unshard]
    rec, errors, waits, _clock = each_step

    def train() -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        policy = ModuleWrapPolicy({torch.nn.Linear})
        # One rank shards nothing: FSDP would switch to NO_SHARD, and warn.
        one = ShardingStrategy.NO_SHARD
        model = FSDP(
            net, device_id=torch.device("cpu"), auto_wrap_policy=policy, sharding_strategy=one
        )
        grads = []
        for i in range(3):
            rec.open_step()
            x = torch.full((2, 4), float(i + 1))
            if i == 2:
                with model.no_sync():  # accumulates: no reduction waited for at the end
                    model(x).sum().backward()
            else:
                model(x).sum().backward()
            grads += [p.grad.clone() for p in model.parameters()]
            rec.boundary("explicit")
        return grads

    plain = train()
    # Each mark records whether FSDP's call after the wait closed it (the prefetch, the reshard).
    closed_by_fsdp: list[bool] = []
    record = waits.events.record

    def record_where():
        frames = [sys._getframe(depth).f_code.co_name for depth in range(1, 6)]
        closed_by_fsdp.append("closing" in frames)
        return record()

    waits.events.record = record_where
    part = ClassicFsdpWaitTiming(waits)
    try:
        assert part.instrument()
        marked = train()
    finally:
        part.uninstrument()
    # Per step: the two Linear modules' forward and backward waits (the root holds no
    # parameters), and the end of backward but under no_sync.
    assert len(waits.events.marks) == 2 * (3 * 4 + 2)
    assert closed_by_fsdp == [False, True] * (3 * 4 + 2), "this torch calls them by name"
    assert waits.drain() == 3 * 4 + 2 and not any(errors.snapshot().values())
    assert all(torch.equal(a, b) for a, b in zip(plain, marked, strict=True))
    after = [getattr(fsdp.runtime, n) for n in NAMES] + [fsdp.front._pre_forward_unshard]
    assert after == before


@pytest.mark.job
def test_a_classic_fsdp_straggler_is_named_by_compute_and_its_collectives_counted():
    slow = 2
    args = [
        *("--parallel", "fsdp", "--fault", "straggler", "--fault-rank", str(slow)),
        *("--fault-after", "0", "--straggle", "0.12", "--step-time", "0.02"),
        *("--port", "0", "--addr", "127.0.0.1"),
    ]
    with Job(3, args, env={"OMP_NUM_THREADS": "1"}) as job:
        urls = job.wait_urls()
        blamed = top_accuses([urls[r] for r in range(3)], slow, "straggler: compute")
        wait_for(blamed, 90, f"top to blame rank {slow} alone, by compute", interval=2.0)
        s = job.scrape(0)
    ((info, _),) = s["ddp_rank_info"]
    assert info["parallelism"] == "fsdp" and info["comm_timing"] == "collectives", info
    timed = {lab["op"] for lab, v in s["ddp_collective_duration_seconds_count"] if v > 0}
    assert {"allgather", "reduce_scatter"} <= timed, timed
    assert value(s, "ddp_step_phase_seconds_sum", phase="comm_wait") > 0
