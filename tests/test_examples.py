"""The examples a user starts from: each trains to its end under torchrun on gloo, monitored.

``examples/train_ddp.py`` (DDP, DistributedSampler, checkpoint and resume) and
``examples/train_fsdp2.py`` (FSDP2), two ranks each: every rank serves ``/metrics`` with its
steps while it trains, the loss goes down, and the job exits 0. Their docstrings carry the
torchrun commands of the README's user path (one node, several nodes, Slurm).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import REPO, Job, value

pytestmark = pytest.mark.job

EXAMPLES = Path(REPO) / "examples"
#: Free ports, no wait for a final scrape: the examples as a user runs them, minus the waits.
ENV = {
    "DDP_EXPORTER_PORT": "0",
    "DDP_EXPORTER_FINAL_SCRAPE_S": "0",
    "OMP_NUM_THREADS": "1",
    "DDP_EXPORTER_RUN": "example",
}


def _train(script: str, args: list[str], parallelism: str) -> str:
    """Run ``script`` on two ranks; scrape both while they train; return what the job printed."""
    with Job(2, args, env=ENV, module=str(EXAMPLES / script)) as job:
        job.wait_urls()
        for rank in (0, 1):
            s = job.scrape(rank)
            assert value(s, "ddp_rank_info", rank=str(rank))
            info = next(lab for lab, _ in s["ddp_rank_info"])
            assert info["parallelism"] == parallelism and info["world_size"] == "2", info
            assert "ddp_steps_total" in s and "ddp_step_phase_seconds_sum" in s
        code = job.wait(timeout=240)
        assert code == 0, job.output()
        return job.text()


def _losses(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"epoch \d+: loss ([0-9.]+)", text)]


def test_train_ddp_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck.pt"
    text = _train("train_ddp.py", ["--epochs", "3", "--checkpoint", str(checkpoint)], "ddp")
    losses = _losses(text)
    assert len(losses) == 3 and losses[-1] < losses[0] / 2, text
    assert checkpoint.exists()
    # Restarted with one more epoch, it resumes after the last epoch it saved.
    text = _train("train_ddp.py", ["--epochs", "4", "--checkpoint", str(checkpoint)], "ddp")
    assert re.findall(r"epoch (\d+): loss", text) == ["3"], text


def test_train_fsdp2_trains(tmp_path: Path) -> None:
    losses = _losses(_train("train_fsdp2.py", ["--epochs", "2"], "fsdp2"))
    assert len(losses) == 2 and losses[-1] < losses[0], losses
