"""The DDP options real jobs use, each on a real 2-rank gloo job against the same job plain.

One torchrun job (tests/workers/options_worker.py) runs every option in sequence, training the
same model with and without the exporter on the same batches, and scrapes the instrumented
copy's endpoint; each option is then checked here as its own test. The exporter runs in its
default mode (DDP's reducer times its own allreduce; a user hook is DDP's own business).
"""

import json
import math

import pytest
from integrations_util import worker_job

pytestmark = pytest.mark.job

STEPS = 6  # optimizer steps per option, as in the worker
OPTIONS = (
    "no_sync",
    "amp_bf16_gradscaler",
    "find_unused_parameters",
    "static_graph",
    "gradient_as_bucket_view",
    "new_group",
    "fp16_compress_hook",
    "powersgd_hook",
    "torch_compile",
)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    out = tmp_path_factory.mktemp("options") / "verdict.json"
    with worker_job("tests/workers/options_worker.py", [str(out)]) as job:
        assert job.wait(timeout=280) == 0, job.output()
    return json.loads(out.read_text())


@pytest.mark.parametrize("option", OPTIONS)
def test_option(verdicts, option):
    for rank, per_rank in enumerate(verdicts):
        r = per_rank[option]
        if "skipped" in r:
            pytest.skip(f"{option}: {r['skipped']}")
        where = f"rank {rank} {option}: {r}"
        assert r["params_identical"], f"parameters differ from the plain job; {where}"
        # Steps are optimizer steps actually taken, never micro-batches or skipped steps.
        assert r["taken"] == r["plain_taken"], where
        assert r["steps"] == r["taken"] == r["step_count"], where
        expected = STEPS - 1 if option == "amp_bf16_gradscaler" else STEPS
        assert r["taken"] == expected, where
        phases = r["phases"]
        assert set(phases) == {"data", "compute", "comm_wait", "optimizer"}, where
        assert all(v >= 0.0 for v in phases.values()), where
        assert math.isclose(sum(phases.values()), r["step_sum"], rel_tol=1e-6), where
        assert phases["data"] > 0.0 and phases["optimizer"] > 0.0, where
        # Collective latency recorded, on the DDP model's own process group.
        assert list(r["collectives"]) == [r["pg"]], where
        if option == "no_sync":
            # The no_sync() micro-batches reduce nothing: as many bucket allreduces as the
            # same model with one micro-batch per step (same buckets) launches.
            same_buckets = per_rank["gradient_as_bucket_view"]["collectives"]["0"]
            assert r["collectives"][r["pg"]] == same_buckets, where
        elif r["timing"] == "hook":
            assert r["collectives"][r["pg"]] >= STEPS - 1, where
        else:
            # DDP's reducer: one reading per step, as it closes (a step the GradScaler skipped
            # closes no step: its iteration is not read).
            assert r["timing"] == "reducer", where
            assert r["collectives"][r["pg"]] >= r["taken"], where
        assert r["errors"] == 0.0, where
    if option == "new_group":
        assert verdicts[0][option]["pg"] != "0", "the DDP model should use the subgroup"
