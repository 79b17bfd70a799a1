"""A tensor-parallel job on a 2-D mesh: its DTensor collectives counted, a straggler, then a hang.

Four real processes, one per rank (as srun starts them): the demo trainer with ``--parallel tp``
(tensor parallelism within pairs of ranks, ``ColwiseParallel`` then ``RowwiseParallel``, and
FSDP2 across the pairs: mesh ``dp`` x ``tp``) and ``clip_grad_norm_``. Every collective of
tensor parallelism and of the clipping is a DTensor (functional) collective, which no
``torch.distributed`` wrapper sees: they are counted by kind and group, and their waits are
communication. Rank 3 straggles: its tensor-parallel peer, rank 2, waits for it in those
collectives every step, and must not look slow itself. ``top`` names rank 3 by compute and
nobody else. Then rank 3 stops in user code: the hang verdict names it with its file and line.
"""

from __future__ import annotations

import glob

import pytest
from harness import Ranks, parse, scrape_text, trainer_stuck_at, verdict_culprits, wait_for

import exporter.tools.top as top

pytestmark = pytest.mark.job

RANKS, SLOW, HANG_AFTER = 4, 3, 45.0


class Top:
    """Read the ranks' endpoints with ``top``'s own code, one judgement per read."""

    def __init__(self, urls: list[str]) -> None:
        self.urls, self.history, self.tables = urls, top.ReadHistory(), []

    def read(self) -> dict[int, str]:
        rows = self.history.judge(top.fetch(self.urls))
        self.tables.append({r.rank: r.verdict for r in rows})
        return self.tables[-1]


def test_tensor_parallel_straggler_named_by_compute_then_its_hang_by_file_line(tmp_path):
    dumps = tmp_path / "dumps"
    cmd = [
        "-m",
        "exporter.tools.trainer",
        "--parallel",
        "tp",
        "--clip",
        "1.0",
        "--duration",
        "0",
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        "--heartbeat",
        "1",
        "--fault",
        "straggler",
        "--fault-rank",
        str(SLOW),
        "--fault-after",
        "3",
        "--hang-after",
        str(HANG_AFTER),
    ]
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_RUN": "tp", "DDP_EXPORTER_DUMP_DIR": str(dumps)}
    with Ranks(RANKS, cmd, env=env) as job:
        wait_for(lambda: len(job.urls) == RANKS, 180, "every rank's metrics URL")
        urls = [job.urls[r] for r in range(RANKS)]
        wait_for(lambda: job.seen("injecting fault straggler"), 120, "the straggler")
        reader = Top(urls)

        def named() -> bool:
            table = reader.read()
            return table.get(SLOW, "").startswith("straggler: compute")

        wait_for(named, 60, f"top to name rank {SLOW} a straggler by compute", interval=2.0)
        wrongly = [
            (r, v)
            for t in reader.tables
            for r, v in t.items()
            if r != SLOW and v.startswith(top.ACCUSATIONS)
        ]
        assert not wrongly, (wrongly, reader.tables)

        # The DTensor collectives, by kind and group: tensor parallelism's all-reduce (and the
        # clipping's, on both mesh dimensions) beside FSDP2's all-gathers and reductions.
        s = parse(scrape_text(urls[2]))
        timed = {(lab["op"], lab["pg"]): v for lab, v in s["ddp_collective_duration_seconds_count"]}
        untimed = {(lab["op"], lab["pg"]): v for lab, v in s["ddp_collective_untimed_total"]}
        reduce_groups = {pg for op, pg in timed if op == "allreduce"}
        gather_groups = {pg for op, pg in timed if op == "allgather"}
        assert len(reduce_groups) == 2 and len(gather_groups) == 1, timed
        assert (reduce_groups - gather_groups) and all(timed.values()), timed
        assert not any(untimed.values()), untimed
        # Rank 2 waits for its tensor-parallel peer inside those collectives: communication.
        phase = {lab["phase"]: v for lab, v in s["ddp_step_phase_seconds_sum"]}
        assert phase["comm_wait"] > phase["compute"], phase

        folder = wait_for(
            lambda: glob.glob(str(dumps / "*-hang-*" / "verdict.txt")), 150, "the hang verdict"
        )
    with open(folder[0]) as f:
        verdict = f.read()
    culprits = verdict_culprits(verdict)
    assert len(culprits) == 1 and culprits[0].startswith(f"rank {SLOW} "), verdict
    assert trainer_stuck_at() in culprits[0], verdict
    assert "mesh_dp" in culprits[0] or "mesh_tp" in culprits[0], verdict
