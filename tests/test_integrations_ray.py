"""A job under Ray Train, which runs the training function on a thread of each worker.

Two CPU workers on gloo, rank 1 slowed in compute, train a loop of collectives (gradients
averaged by hand), then a DDP model from ``prepare_model``: in both, the healthy rank's wait for
the slow one is comm_wait, and only the slow rank has the compute.
"""

import glob
import importlib.util
import json
import os
import shutil
import sys
import tempfile

import leftovers
import pytest
from harness import Process, child_env

# Solo: Ray's raylet must register with its GCS within a fixed 30 s (not configurable), which
# a start of its dozen processes beside the suite's other jobs on 2 cores has missed.
pytestmark = [pytest.mark.job, pytest.mark.solo]

# Looked up, not imported: the worker imports Ray, and every test process need not.
if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Train not installed", allow_module_level=True)

WORKER = "tests/workers/ray_worker.py"
STEPS, SLOW_S = 100, 0.03  # per kind, as in the worker


def test_ray_train_counts_the_waits_of_its_training_thread(tmp_path):
    # Ray's sockets live in its session folder: a short path, not pytest's.
    session = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = child_env({"RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"})
    try:
        with Process([sys.executable, WORKER, str(tmp_path), session], env, "ray") as job:
            assert job.wait(timeout=240) == 0, job.text()
        # Ray's processes outlive ray.shutdown() for a moment: none may load the next solo test.
        assert not leftovers.wait_gone(timeout=60), "Ray's processes did not end"
    finally:
        shutil.rmtree(session, ignore_errors=True)
    ranks = {}
    for path in glob.glob(os.path.join(tmp_path, "rank-*.json")):
        with open(path) as f:
            r = json.load(f)
        ranks[r["rank"]] = r
    assert sorted(ranks) == [0, 1], job.text()
    for kind, parallelism in (("loop", "module"), ("ddp", "ddp")):
        for r in ranks.values():
            served = r[kind]
            assert not r["main"] and served["training"], r
            assert served["steps"] == STEPS and served["parallelism"] == parallelism, served
        healthy, slow = ranks[0][kind]["phases"], ranks[1][kind]["phases"]
        # Half the slow rank's extra compute, at least, shows as the healthy rank's wait.
        assert healthy["comm_wait"] > 0.5 * SLOW_S * STEPS, (kind, ranks)
        assert slow["compute"] - healthy["compute"] > 0.5 * SLOW_S * STEPS, (kind, ranks)
