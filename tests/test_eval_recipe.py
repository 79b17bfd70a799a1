"""The evaluation recipe (README): a real 3-rank gloo job with one heavier shard and a final gather.

From scraped metrics alone: the heavy rank has the largest compute per step (it is the
straggler), the light ranks wait in the all_gather with a growing in-flight age against their
collective timeout, and the heavy rank is behind in the collective sequence (it has not entered).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import value, wait_for
from worker_job import WorkerJob

pytestmark = pytest.mark.job

HEAVY, LIGHT = 1, (0, 2)


def _per_step(s: dict, name: str, **labels: str) -> float:
    return value(s, name + "_sum", **labels) / max(value(s, name + "_count", **labels), 1.0)


def _inflight(s: dict) -> tuple[float, float, float, float]:
    """Return (age, timeout, last enqueued, last completed) of the default process group."""
    pg = {"pg": "0"}
    return (
        value(s, "ddp_collective_inflight_age_seconds", **pg),
        value(s, "ddp_collective_timeout_seconds", **pg),
        value(s, "ddp_collective_last_enqueued_seq", **pg),
        value(s, "ddp_collective_last_completed_seq", **pg),
    )


def test_heavy_shard_is_the_straggler_and_light_ranks_wait_in_the_gather(tmp_path: Path) -> None:
    release = tmp_path / "release"
    with WorkerJob(3, "eval_worker.py", [str(release)], {}) as job:
        job.wait_urls()
        wait_for(
            lambda: all(f"rank {r}: evaluated" in job.output() for r in LIGHT),
            120,
            "the light ranks to finish their shards",
        )
        first = wait_for(
            lambda: (
                (s := {r: job.scrape(r) for r in range(3)})
                and all(_inflight(s[r])[0] > 1.0 for r in LIGHT)
                and s
            ),
            60,
            "the light ranks' gather to be in flight for over 1 s",
        )
        later = wait_for(
            lambda: (
                (s := {r: job.scrape(r) for r in range(3)})
                and all(_inflight(s[r])[0] > _inflight(first[r])[0] + 1.0 for r in LIGHT)
                and s
            ),
            30,
            "the in-flight age to keep growing",
        )
        assert f"rank {HEAVY}: evaluated" not in job.output()
        release.touch()
        assert job.wait(90) == 0, job.output()
    assert "rank 0: gathered 3 ranks" in job.output()

    compute = {r: _per_step(later[r], "ddp_step_phase_seconds", phase="compute") for r in range(3)}
    assert max(compute, key=compute.get) == HEAVY, compute
    assert all(compute[HEAVY] > 2 * compute[r] for r in LIGHT), compute
    # The heavy rank kept stepping while the others waited.
    steps = {r: value(later[r], "ddp_steps_total") for r in range(3)}
    assert all(steps[r] == 20 for r in LIGHT), steps
    assert value(later[HEAVY], "ddp_steps_total") > value(first[HEAVY], "ddp_steps_total")
    for r in LIGHT:
        age, timeout, enqueued, completed = _inflight(later[r])
        assert 1.0 < age < timeout, (r, age, timeout)  # on the timeout budget, not over it
        assert enqueued > completed, (r, enqueued, completed)
    age, _, heavy_enqueued, _ = _inflight(later[HEAVY])
    assert age == 0.0
    # The heavy rank never entered the gather: behind the others in the sequence (role=behind).
    assert all(heavy_enqueued < _inflight(later[r])[2] for r in LIGHT)
