"""Classic FSDP (``FullyShardedDataParallel``): a job watched, and its waits marked on a GPU.

A classic FSDP job on gloo under torchrun: its straggler named by compute, its collectives
counted. Stand-in events (tests/eventstandin.py) mark where the compute stream would wait on a GPU: before
each module's forward and backward (its all-gather) and at the end of backward (the gradient
reductions). FSDP is torch's own, on a real one-rank gloo group; stand-in modules give the cases
a one-rank group cannot reach.
"""

from __future__ import annotations

import types

import pytest
import torch
from eventstandin import device_waits
from harness import Job, top_accuses, value, wait_for

from exporter.sources.classicwaits import ClassicFsdp, ClassicFsdpWaitTiming, classic_fsdp

NAMES = ("_pre_forward_unshard", "_pre_backward_hook", "_post_backward_final_callback")


@pytest.fixture
def each_step():
    """Device waits timing every step's waits, on stand-in events."""
    made = device_waits(1)
    yield made
    made[2].close()


def stand_ins(log: list[str]) -> ClassicFsdp:
    """Classic FSDP's two modules as far as the part uses them, logging each call."""

    def unshard(state, handle):
        log.append("forward waits")

    def pre_backward(state, module, handle, grad, *unused):
        log.append("backward waits")
        return grad

    def tail(state, module):
        log.append("tail waits")

    runtime = types.SimpleNamespace(_pre_forward_unshard=unshard, _pre_backward_hook=pre_backward)
    runtime._post_backward_final_callback = tail
    return ClassicFsdp(runtime, types.SimpleNamespace(_pre_forward_unshard=unshard))


def logging_marks(waits, log: list[str]) -> None:
    real_record = waits.events.record
    waits.events.record = lambda: (log.append("mark"), real_record())[1]


def handle(**flags) -> types.SimpleNamespace:
    return types.SimpleNamespace(**flags)


@pytest.mark.unit
def test_each_wait_is_marked_whole_only_where_fsdp_waits(each_step):
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
    fsdp.runtime._pre_forward_unshard(state, None)  # a module without parameters
    gathers = handle(_needs_pre_backward_unshard=True, _ran_pre_backward_hook=False)
    assert fsdp.runtime._pre_backward_hook(state, None, gathers, "grad") == "grad"
    fsdp.runtime._pre_backward_hook(state, None, handle(_ran_pre_backward_hook=True), "g")
    fsdp.runtime._pre_backward_hook(state, None, handle(_needs_pre_backward_unshard=False), "g")
    fsdp.runtime._pre_backward_hook(state, None, None, "g")
    fsdp.runtime._pre_backward_hook(state, None, handle(), "g")  # a later torch's handle: marked
    fsdp.runtime._post_backward_final_callback(synced, None)
    fsdp.runtime._post_backward_final_callback(types.SimpleNamespace(_sync_gradients=False), None)
    assert log == [
        *("mark", "forward waits", "mark"),
        "forward waits",
        *("mark", "backward waits", "mark"),
        *("backward waits",) * 3,
        *("mark", "backward waits", "mark"),
        *("mark", "tail waits", "mark"),
        "tail waits",  # no_sync: nothing reduced, nothing waited for
    ]
    assert waits.drain() == 4 and not any(errors.snapshot().values())
    part.uninstrument()
    part.uninstrument()
    assert (dict(vars(fsdp.runtime)), dict(vars(fsdp.front))) == originals


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
    assert log == ["backward waits", "tail waits"] and waits.events.marks == []
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
    part = ClassicFsdpWaitTiming(waits)
    try:
        assert part.instrument()
        marked = train()
    finally:
        part.uninstrument()
    # Per step: the two Linear modules' forward and backward waits (the root holds no
    # parameters), and the end of backward but under no_sync.
    assert len(waits.events.marks) == 2 * (3 * 4 + 2)
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
