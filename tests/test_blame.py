"""Real multi-rank gloo jobs under torchrun: the metrics blame the right rank."""

import time

import pytest
from harness import Job, value, wait_for

pytestmark = pytest.mark.job


def demo_args(fault: str, rank: int, after: float, *extra: str) -> list[str]:
    """Return exporter.tools.trainer arguments for ``fault`` on ``rank`` after ``after`` seconds."""
    return [
        "--fault",
        fault,
        "--fault-rank",
        str(rank),
        "--fault-after",
        str(after),
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        *extra,
    ]


def _per_step(s, name, **labels):
    return value(s, name + "_sum", **labels) / max(value(s, name + "_count", **labels), 1.0)


@pytest.mark.parametrize("sync_loss", [False, True], ids=["ddp", "ddp-sync-loss"])
def test_straggler_has_largest_compute_and_shortest_collectives(sync_loss):
    """With ``--sync-loss`` the healthy ranks wait for the straggler in the loop's own
    all-reduce of the loss, before DDP's buckets: that wait is their comm_wait too."""
    extra = ["--sync-loss"] if sync_loss else []
    args = demo_args("straggler", 1, 0, "--straggle", "0.12", "--step-time", "0.02", *extra)
    with Job(3, args) as job:
        job.wait_urls()
        wait_for(
            lambda: all(value(job.scrape(r), "ddp_steps_total") >= 25 for r in range(3)),
            90,
            "25 steps on every rank",
        )
        s = {r: job.scrape(r) for r in range(3)}
    compute = {r: _per_step(s[r], "ddp_step_phase_seconds", phase="compute") for r in s}
    comm = {r: _per_step(s[r], "ddp_step_phase_seconds", phase="comm_wait") for r in s}
    coll = {r: _per_step(s[r], "ddp_collective_duration_seconds") for r in s}
    assert max(compute, key=compute.get) == 1, compute
    assert min(comm, key=comm.get) == 1, comm
    for healthy in (0, 2):
        assert comm[healthy] > 0.05, comm
        assert compute[1] > 2 * compute[healthy], compute
        if not sync_loss:  # they waited in the loss's all-reduce, not in DDP's
            # The healthy ranks wait for the straggler inside the allreduce.
            assert coll[healthy] > coll[1], coll


def test_hung_rank_is_behind_and_peer_endpoint_keeps_answering():
    args = demo_args("hang", 1, 3, "--heartbeat", "0.5")
    with Job(2, args) as job:
        job.wait_urls()
        wait_for(lambda: "injecting fault hang" in job.output(), 60, "the hang to start")
        first = wait_for(
            lambda: (
                (a := value(job.scrape(0), "ddp_collective_inflight_age_seconds", pg="0")) > 1.0
                and a
            ),
            30,
            "an in-flight collective on rank 0",
        )
        wait_for(
            lambda: value(job.scrape(0), "ddp_collective_inflight_age_seconds", pg="0") > first + 1,
            10,
            "rank 0's in-flight age to keep growing",
        )
        t0 = time.monotonic()
        s0 = job.scrape(0)
        assert time.monotonic() - t0 < 2.0, "rank 0's endpoint is slow while its trainer is blocked"
        s1 = job.scrape(1)
    later = value(s0, "ddp_collective_inflight_age_seconds", pg="0")
    assert later > first + 1.0, (first, later)
    seq0 = value(s0, "ddp_collective_last_enqueued_seq", pg="0")
    seq1 = value(s1, "ddp_collective_last_enqueued_seq", pg="0")
    assert seq1 < seq0, (seq0, seq1)
    assert value(s0, "ddp_collective_last_completed_seq", pg="0") < seq0
    assert value(s1, "ddp_collective_inflight_age_seconds", pg="0") == 0.0
    assert value(s0, "ddp_collective_timeout_seconds", pg="0") == 1800.0


def test_peer_heartbeat_age_grows_for_a_frozen_rank():
    args = demo_args("freeze", 2, 3, "--heartbeat", "0.3")
    with Job(3, args) as job:
        job.wait_urls()
        wait_for(lambda: "injecting fault freeze" in job.output(), 60, "the freeze")

        def ages():
            s = job.scrape(0)
            return {
                p: value(s, "ddp_peer_heartbeat_age_seconds", peer_rank=str(p)) for p in range(3)
            }

        a = wait_for(lambda: (x := ages())[2] > 3.0 and x, 30, "rank 2's heartbeat age to grow")
    assert a[0] < 2.0 and a[1] < 2.0, a
