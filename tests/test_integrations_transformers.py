"""exporter.integrations.transformers and the accelerate recipe on real 2-rank CPU/gloo jobs.

One torchrun job trains a tiny config-built BERT with transformers.Trainer plain, then with
ExporterCallback while rank 1's dataset is slow (a data straggler), and then runs the
documented accelerate loop plain and instrumented. Checked: parameters bit-identical, steps =
optimizer steps with gradient_accumulation_steps, phases sum to the step time, collectives on
DDP's process group, zero exporter errors, evaluation and checkpoint saving in declared sections,
everything restored at the end, and the straggler has the largest data phase.
"""

import json
import math

import pytest
from integrations_util import worker_job

pytest.importorskip("transformers", reason="extra ddp-exporter[transformers] not installed")
pytest.importorskip("accelerate", reason="extra ddp-exporter[transformers] not installed")

pytestmark = pytest.mark.job

N, BATCH, ACCUM = 96, 4, 3  # as in the worker
STEPS = N // 2 // BATCH // ACCUM  # optimizer steps per rank


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "verdict.json"
    with worker_job("tests/workers/transformers_worker.py", [str(out)]) as job:
        assert job.wait(timeout=280) == 0, job.output()
    return json.loads(out.read_text())


def _check_common(r: dict, where: str) -> None:
    assert r["params_identical"], where
    assert r["steps"] == r["step_count"] == r["taken"] == STEPS, where
    assert all(v >= 0.0 for v in r["phases"].values()), where
    assert math.isclose(sum(r["phases"].values()), r["step_sum"], rel_tol=1e-6), where
    assert r["phases"]["data"] > 0.0, where
    # The default mode: DDP's reducer times its own allreduce, one reading per step.
    assert r["timing"] == "reducer", where
    assert r["collectives"] == {r["pg"]: STEPS}, where
    assert r["errors"] == 0.0, where


def test_trainer_callback_with_a_data_straggler(verdicts):
    for rank, per_rank in enumerate(verdicts):
        r = per_rank["trainer"]
        where = f"rank {rank}: {r}"
        _check_common(r, where)
        # Optimizer steps with gradient_accumulation_steps=3, as the Trainer counts them.
        assert r["global_step"] == r["plain_global_step"] == STEPS, where
        assert r["closed"] and r["hooks_left"] == 0, "not restored at on_train_end; " + where
        # Evaluation and the checkpoint save ran in declared sections, then were restored.
        assert r["busy"] == ["evaluation"], where
        assert r["sections"] == {"evaluation": 2.0, "checkpoint": 1.0}, where
        assert r["restored"], where
    data = {rank: verdicts[rank]["trainer"]["phases"]["data"] / STEPS for rank in (0, 1)}
    assert data[1] > 5 * data[0], data


def test_accelerate_recipe(verdicts):
    for rank, per_rank in enumerate(verdicts):
        r = per_rank["accelerate"]
        _check_common(r, f"rank {rank}: {r}")
        assert r["plain_taken"] == STEPS, r
