"""A rank that runs out of inputs first waits in ``Join`` as comm_wait, and is no straggler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from worker_job import WorkerJob

from exporter.mixin import DEFAULT

pytestmark = pytest.mark.job

BATCHES, EXTRA, STEP_S, EPOCHS = 20, 40, 0.02, 2  # as in tests/workers/join_worker.py


def test_the_rank_waiting_in_join_counts_the_wait_as_comm_not_compute(tmp_path: Path) -> None:
    """Its wait landed in its next step's compute: the rank that finished first was named the
    straggler by compute, 2x its peer's."""
    out = tmp_path / "results.json"
    with WorkerJob(2, "join_worker.py", [str(out)], {}) as job:
        assert job.wait(timeout=240) == 0, job.output()
    longer, joined = json.loads(out.read_text())
    assert (longer["steps"], joined["steps"]) == (EPOCHS * (BATCHES + EXTRA), EPOCHS * BATCHES)
    assert longer["restored"] and joined["restored"]
    # The first epoch's wait closes in the second epoch's first step: at least the longer
    # rank's extra steps, each STEP_S or more.
    assert joined["phases"]["comm_wait"] >= EXTRA * STEP_S, joined
    per_step = {
        name: r["phases"]["compute"] / r["steps"]
        for name, r in (("longer", longer), ("joined", joined))
    }
    assert per_step["joined"] < DEFAULT.straggler_ratio * per_step["longer"], per_step
