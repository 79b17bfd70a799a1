"""A job under Ray Train, which runs the training function on a thread of each worker.

Two CPU workers on gloo average their gradients by hand (a loop of collectives), rank 1 slowed
in compute: the healthy rank's wait for it is comm_wait, and only the slow rank has the compute.
"""

import glob
import json
import os
import shutil
import sys
import tempfile

import pytest
from harness import Process, child_env

pytestmark = pytest.mark.job

pytest.importorskip("ray.train", reason="Ray Train not installed")

WORKER = "tests/workers/ray_worker.py"
STEPS, SLOW_S = 120, 0.03  # as in the worker


def test_ray_train_counts_the_waits_of_its_training_thread(tmp_path):
    # Ray's sockets live in its session folder: a short path, not pytest's.
    session = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = child_env({"RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"})
    try:
        with Process([sys.executable, WORKER, str(tmp_path), session], env, "ray") as job:
            assert job.wait(timeout=240) == 0, job.text()
    finally:
        shutil.rmtree(session, ignore_errors=True)
    ranks = {}
    for path in glob.glob(os.path.join(tmp_path, "rank-*.json")):
        with open(path) as f:
            r = json.load(f)
        ranks[r["rank"]] = r
    assert sorted(ranks) == [0, 1], job.text()
    for r in ranks.values():
        assert not r["main"] and r["training"], r
        assert r["steps"] == STEPS and r["parallelism"] == "module", r
    healthy, slow = ranks[0]["phases"], ranks[1]["phases"]
    # Half the slow rank's extra compute, at least, shows as the healthy rank's wait.
    assert healthy["comm_wait"] > 0.5 * SLOW_S * STEPS, ranks
    assert slow["compute"] - healthy["compute"] > 0.5 * SLOW_S * STEPS, ranks
