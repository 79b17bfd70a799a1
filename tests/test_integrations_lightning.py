"""exporter.integrations.lightning on a real 2-rank Lightning DDP fit (CPU, gloo, torchrun).

One job fits a tiny model plain, then with ExporterCallback while rank 1 is slowed inside its
training_step (which Lightning runs inside optimizer.step()'s closure): parameters bit-identical,
steps = Lightning's optimizer steps with accumulate_grad_batches, phases sum to the step time,
the straggler has the largest compute, a comm hook registered in a later callback's
on_train_start (README's recipe) is timed, validation and the checkpoint save run in declared
sections, and everything is restored at teardown.
"""

import json
import math

import pytest
from integrations_util import worker_job

pytestmark = pytest.mark.job

pytest.importorskip("lightning", reason="extra ddp-exporter[lightning] not installed")

BATCHES, ACCUM = 24, 2  # as in the worker


def _per_step(r: dict, phase: str) -> float:
    return r["phases"][phase] / r["steps"]


def test_lightning_fit_with_a_compute_straggler(tmp_path):
    out = tmp_path / "verdict.json"
    with worker_job("tests/workers/lightning_worker.py", [str(out)]) as job:
        assert job.wait(timeout=280) == 0, job.output()
    res = json.loads(out.read_text())
    for rank, r in enumerate(res):
        where = f"rank {rank}: {r}"
        assert r["params_identical"], where
        # Optimizer steps, not batches: accumulate_grad_batches=2 halves them.
        assert r["global_step"] == BATCHES // ACCUM == r["taken"] == r["plain_taken"], where
        assert r["steps"] == r["step_count"] == r["global_step"], where
        assert all(v >= 0.0 for v in r["phases"].values()), where
        assert math.isclose(sum(r["phases"].values()), r["step_sum"], rel_tol=1e-6), where
        assert r["phases"]["data"] > 0.0, "the first epoch's batches were not timed; " + where
        # The default mode: DDP's reducer times its own communication under the fp16 hook
        # registered after ExporterCallback, one reading per step.
        assert r["timing"] == "reducer", where
        assert r["collectives"] == {r["pg"]: BATCHES // ACCUM}, where
        assert r["errors"] == 0.0, where
        assert r["closed"] and r["hooks_left"] == 1, "not restored at teardown; " + where
        # Validation and the checkpoint save ran inside declared sections (not hangs, not
        # steps), and teardown put trainer.save_checkpoint back.
        assert r["busy"] == {"validation": ["evaluation"], "checkpoint": ["checkpoint"]}, where
        assert r["sections"] == {"evaluation": 1.0, "checkpoint": 1.0}, where
        assert r["save_restored"], where
    # The straggler's sleep runs in Lightning's optimizer closure: it is compute, not optimizer.
    compute = {r: _per_step(res[r], "compute") for r in (0, 1)}
    comm = {r: _per_step(res[r], "comm_wait") for r in (0, 1)}
    assert compute[1] > compute[0], compute
    assert comm[0] > comm[1], comm
    assert max(_per_step(res[r], "optimizer") for r in (0, 1)) < 0.01, res


def test_lightning_model_parallel_strategy_with_fsdp2(tmp_path):
    """ModelParallelStrategy with FSDP2 in configure_model: the one-line callback instruments the
    sharded module; steps, the step split and every collective kind are seen. (FSDPStrategy,
    classic FSDP, refuses a CPU accelerator.)"""
    out = tmp_path / "verdict.json"
    with worker_job("tests/workers/lightning_fsdp_worker.py", [str(out)]) as job:
        assert job.wait(timeout=280) == 0, job.output()
    for rank, r in enumerate(json.loads(out.read_text())):
        where = f"rank {rank}: {r}"
        assert r["parallelism"] == "fsdp2", where
        assert r["timing"] == "collectives" and r["errors"] == 0.0, where
        assert r["steps"] == r["step_count"] == r["global_step"] == 16, where
        assert math.isclose(sum(r["phases"].values()), r["step_sum"], rel_tol=1e-6), where
        # Every step all-gathers the weights and reduces the gradients.
        assert r["ops"].get("allgather", 0) >= 16 and r["ops"].get("reduce_scatter", 0) >= 16, where
        assert r["closed"], where
