"""torch's coalescing manager (DeepSpeed's ZeRO): its one coalesced collective
is counted and timed like any other, on a real one-rank gloo process group."""

import json
import os

import pytest
import torch
import torch.distributed as dist
from harness import REPO, Job, parse, scrape_text, value, verdict_folder, wait_for

import exporter

C10D = dist.distributed_c10d
if not hasattr(C10D, "_coalescing_manager"):  # private: a torch without it has nothing to count
    pytest.skip("this torch has no coalescing manager", allow_module_level=True)

WORKER = os.path.join("tests", "workers", "coalesced_worker.py")

GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
SCATTER = (
    "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
)


@pytest.fixture
def observed(world1):
    """The exporter on a plain loop (its collectives wrapped), closed after the test."""
    before = (C10D._coalescing_manager, dist._coalescing_manager)
    obs = exporter.instrument(None, port=0, addr="127.0.0.1", heartbeat_s=0)
    yield obs
    obs.close()
    assert (C10D._coalescing_manager, dist._coalescing_manager) == before


def _series(obs, op):
    s = parse(scrape_text(obs.url))
    count = value(s, "ddp_collective_duration_seconds_count", op=op, pg="0")
    return count, value(s, "ddp_collective_bytes_total", op=op, pg="0")


@pytest.mark.unit
def test_a_synchronous_coalesced_allreduce_is_one_timed_collective(observed):
    a, b = torch.ones(3), torch.ones(5)
    with exporter.step():
        with C10D._coalescing_manager():  # as DeepSpeed calls it, looked up at each use
            assert dist.all_reduce(a) is None and dist.all_reduce(b) is None
        with C10D._coalescing_manager(async_ops=False):
            dist.all_reduce(a)
    assert a.tolist() == [1.0] * 3 and b.tolist() == [1.0] * 5  # the sum over one rank
    assert _series(observed, "allreduce") == (2, 4 * (3 + 5) + 4 * 3)
    assert all(n == done for _pg, n, done, _age in observed.recorder.inflight())
    assert not any(observed.errors.snapshot().values())


@pytest.mark.unit
def test_an_asynchronous_one_is_timed_at_its_wait(observed):
    # Looked up in the torch.distributed namespace after instrument().
    manager = dist._coalescing_manager
    out, inputs = [torch.empty(2), torch.empty(4)], [torch.ones(2), torch.ones(4)]
    with exporter.step():
        with manager(async_ops=True) as cm:
            for o, i in zip(out, inputs):
                getattr(dist, GATHER)(o, i, async_op=True)
        in_flight = [(n, done) for _pg, n, done, _age in observed.recorder.inflight()]
        cm.wait()
    assert in_flight == [(1, 0)], in_flight  # issued at the exit, open until its wait
    assert [o.tolist() for o in out] == [[1.0] * 2, [1.0] * 4]
    assert _series(observed, "allgather") == (1, 4 * 6)
    with exporter.step():
        with manager(group=None, async_ops=True) as cm:
            getattr(dist, SCATTER)(torch.empty(2), torch.ones(2), async_op=True)
        cm.wait()
    assert _series(observed, "reduce_scatter") == (1, 8)
    assert all(n == done for _pg, n, done, _age in observed.recorder.inflight())


@pytest.mark.unit
def test_nothing_queued_a_refused_queue_or_an_error_inside_counts_nothing(observed):
    with C10D._coalescing_manager():
        pass  # batch_isend_irecv's point-to-point calls queue nothing either
    with pytest.raises(RuntimeError, match="same type"):  # torch refuses mixed kinds
        with C10D._coalescing_manager():
            dist.all_reduce(torch.ones(2))
            getattr(dist, GATHER)(torch.empty(2), torch.ones(2))
    with pytest.raises(KeyError):
        with C10D._coalescing_manager():
            raise KeyError("the user's own error")
    s = parse(scrape_text(observed.url))
    assert not [lab for lab, v in s.get("ddp_collective_bytes_total", []) if v]
    # Torch keeps the queue an error left behind: its all_reduce on that group still only
    # queues, a broadcast is issued, and counted.
    with exporter.step():
        dist.all_reduce(torch.ones(2))
        dist.broadcast(torch.ones(3), 0)
    assert C10D._world.pg_coalesce_state  # the all_reduce went into the left queue
    C10D._world.pg_coalesce_state.clear()
    s = parse(scrape_text(observed.url))
    assert _series(observed, "broadcast") == (1, 12)
    assert not [lab for lab, v in s["ddp_collective_bytes_total"] if lab["op"] == "allreduce" and v]
    assert not any(observed.errors.snapshot().values())


@pytest.mark.unit
def test_a_collective_torch_does_not_queue_inside_a_manager_is_issued_and_counted(observed):
    with exporter.step():
        with C10D._coalescing_manager():
            dist.all_reduce(torch.ones(4))
            dist.broadcast(torch.ones(2), 0)  # issued at once: torch queues only three kinds
            dist.barrier()
    assert _series(observed, "allreduce") == (1, 16)
    assert _series(observed, "broadcast") == (1, 8)
    assert _series(observed, "barrier")[0] == 1


def _line_of(marker: str, worker: str = WORKER) -> int:
    with open(os.path.join(REPO, worker)) as f:
        return next(n for n, line in enumerate(f, 1) if marker in line)


@pytest.mark.job
def test_a_zero_like_job_is_counted_per_step_and_its_hung_rank_named(tmp_path):
    """Two ranks under torchrun reduce and gather through the coalescing manager, as DeepSpeed
    does: each step is one all-reduce and one all-gather per rank; then rank 1 stops entering
    them, and the hang watcher names it from the coalesced collective rank 0 waits in."""
    root, release = str(tmp_path / "dumps"), str(tmp_path / "release")
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_DUMP_DIR": root,
        "COALESCED_WORKER_RELEASE": release,
    }
    params = 16 * 32 + 32 + 32 + 1  # the worker's model
    with Job(2, ["30"], env=env, module=WORKER) as job:
        urls = job.wait_urls()
        folder = wait_for(lambda: verdict_folder(root), 180, "the monitoring rank's verdict")
        for url in urls.values():
            s = parse(scrape_text(url))
            reduced = value(s, "ddp_collective_duration_seconds_count", op="allreduce", pg="0")
            gathered = value(s, "ddp_collective_duration_seconds_count", op="allgather", pg="0")
            # 30 healthy steps; rank 0 is inside the 31st all-reduce, rank 1 never entered it.
            assert (reduced, gathered) == (30, 30), (url, reduced, gathered)
            assert value(s, "ddp_collective_bytes_total", op="allgather", pg="0") == 30 * 4 * 4
            sent = value(s, "ddp_collective_bytes_total", op="allreduce", pg="0")
            assert sent in (30 * 4 * params, 31 * 4 * params), sent
        with open(os.path.join(folder, "episode.json")) as f:
            episode = json.load(f)
        with open(os.path.join(folder, "verdict.txt")) as f:
            text = f.read()
        assert episode["kind"] == "behind" and episode["behind"] == [1], text
        stuck = _line_of("# stuck here", os.path.join("tests", "workers", "hang_worker.py"))
        assert f"hang_worker.py:{stuck} in load_batch" in text, text
        # Two coalesced collectives a step: the 31st step's all-reduce is the group's #61.
        site = _line_of("# collective call site")
        assert (
            f"rank 0 waits in all_reduce #61 (pg 0), called at coalesced_worker.py:{site}" in text
        )


class _Unreadable:
    """A manager whose signature cannot be read (a C function, an odd wrapper)."""

    __signature__ = "not a signature"

    def __call__(self, *args, **kwargs):
        return C10D._coalescing_manager(*args, **kwargs)


@pytest.mark.unit
def test_a_manager_whose_signature_cannot_be_read_is_left_alone(world1):
    from types import SimpleNamespace

    from exporter.errors import ErrorCounter
    from exporter.sources.collectives import CollectiveTiming
    from exporter.sources.recorder import Recorder

    unreadable = _Unreadable()
    ns = SimpleNamespace(all_reduce=dist.all_reduce, _coalescing_manager=unreadable)
    timing = CollectiveTiming(Recorder("explicit"), ErrorCounter(), namespace=ns)
    try:
        assert timing.instrument()
        assert ns._coalescing_manager is unreadable and ns.all_reduce is not dist.all_reduce
    finally:
        timing.uninstrument()
    assert ns.all_reduce is dist.all_reduce
