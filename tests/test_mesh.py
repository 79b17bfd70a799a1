"""A hang in a 2-D mesh job (HSDP: FSDP2 sharded within pairs of ranks, replicated across).

Four real processes, one per rank (as srun starts them), tests/workers/restart_worker.py with
``--parallel hsdp``: shard groups {0, 1} and {2, 3}, replicate groups {0, 2} and {1, 3}. Rank 1
stops in user code. Rank 0 waits for it in its shard group's all-gather, and so never enters
its replicate group's next all-reduce, where rank 2 waits for rank 0: a cascade in which only
rank 1 is to blame. The hang verdict names rank 1, its file:line and the group (by number and
by DeviceMesh dimension) and says which ranks are held up in other groups; ``ddp-exporter
top`` accuses rank 1 only. The same mesh through a long declared evaluation on one rank opens
no hang at all.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
from harness import Ranks, verdict_culprits, wait_for

pytestmark = pytest.mark.job

WORKER = os.path.join("tests", "workers", "restart_worker.py")


def _line_of(marker: str) -> int:
    with open(WORKER) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line)


def test_a_2d_mesh_hang_names_the_rank_and_its_group(tmp_path):
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_RUN": "mesh",
        "DDP_EXPORTER_DUMP_DIR": str(tmp_path / "dumps"),
        "DDP_EXPORTER_HEARTBEAT_S": "1",
    }
    args = [WORKER, str(tmp_path), "--parallel", "hsdp", "--stuck", "1:40"]
    with Ranks(4, args, env=env) as job:
        found = wait_for(
            lambda: glob.glob(str(tmp_path / "dumps" / "*-hang-*" / "verdict.txt")),
            120,
            "the hang verdict",
        )
        wait_for(lambda: len(job.urls) == 4, 30, "every rank's metrics URL")
        targets = ",".join(job.urls[r] for r in range(4))
        cmd = [
            sys.executable,
            "-m",
            "exporter.tools.cli",
            "top",
            "--targets",
            targets,
            "--once",
            "--refresh",
            "2",
        ]
        table = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    with open(found[0]) as f:
        verdict = f.read()
    stuck = _line_of("# stuck here")
    culprits = verdict_culprits(verdict)
    assert len(culprits) == 1, verdict
    # Rank 1 is behind in both its groups (its shard group's all-gather, its replicate group's
    # all-reduce); the episode is about whichever stalled first, named by number and dimension.
    assert culprits[0].startswith("rank 1 "), verdict
    assert "mesh_shard" in culprits[0] or "mesh_replicate" in culprits[0], verdict
    assert f"restart_worker.py:{stuck} in wait_for_data" in culprits[0], verdict
    # Every other rank is waiting: for rank 1 in the episode's group, or held up in another.
    waiting = verdict.split("WAITING:")[1].split("STACKS")[0]
    assert "rank 0 waits in all_gather" in waiting, verdict
    for r in (2, 3):
        assert f"rank {r} waits in all_reduce" in waiting, verdict
    assert waiting.count("held up by this hang") == 2, verdict
    # top, from the four endpoints: rank 1 is hung, nobody else is accused.
    rows = {int(line.split()[0]): line for line in table.splitlines()[1:] if line.strip()}
    assert "HUNG" in rows[1], table
    for r in (0, 2, 3):
        assert not any(word in rows[r] for word in ("HUNG", "DOWN", "straggler", "STUCK")), table


def test_a_long_section_on_one_rank_of_a_2d_mesh_is_no_hang(tmp_path):
    """Rank 0 evaluates for 70 s (declared) before step 40, past the 60 s symmetric threshold.
    Rank 1 waits for it in their shard group and so never enters its replicate group's next
    collective, where rank 3 waits for rank 1: nobody is behind there, and it is the section's
    wait all the same. No hang episode; with the hang action on, the job finishes."""
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_RUN": "mesh-section",
        "DDP_EXPORTER_DUMP_DIR": str(tmp_path / "dumps"),
        "DDP_EXPORTER_HEARTBEAT_S": "1",
        "DDP_EXPORTER_ON_HANG": "abort",
    }
    args = [WORKER, str(tmp_path), "--parallel", "hsdp", "--steps", "60", "--eval-at", "40:70"]
    with Ranks(4, args, env=env) as job:
        codes = job.wait(300)
        text = job.output()
    assert codes == {r: 0 for r in range(4)}, text
    assert "rank 0: long evaluation at step 40" in text, text
    assert text.count("finished at step 60") == 4, text
    assert not glob.glob(str(tmp_path / "dumps" / "*-hang-*")), text
