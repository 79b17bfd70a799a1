"""A job's whole life without a false page: checkpoint, evaluation, the end, a kill, a restart.

Real torchrun jobs of tests/workers/lifecycle_worker.py, real Prometheus servers with the FAST
rules (the same expressions as the committed ones, short windows), discovering the ranks through
rank 0's ``/sd``, through file_sd and through static targets. ``top`` reads the job from the
ranks' endpoints and from Prometheus all along.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from pathlib import Path

import pytest
from harness import Job, TopReader, wait_for
from promstack import (
    Prometheus,
    fast_config,
    file_sd_scrape,
    firing,
    require,
    run_prometheus,
    sd_scrape,
    static_scrape,
)

import exporter.tools.top as top
from exporter.tools.localstack import free_port

pytestmark = pytest.mark.stack

WORKER = os.path.join("tests", "workers", "lifecycle_worker.py")
RANKS = 3
#: How long after the job's end nothing may fire (the issue's two minutes).
AFTER_END_S = float(os.environ.get("DDP_LIFECYCLE_AFTER_END_S", "120"))


class Watch:
    """Every second: firing alerts of every Prometheus, and ``top`` from endpoints and /sd."""

    def __init__(self, proms: dict[str, Prometheus], reader: TopReader, run: str) -> None:
        self.proms, self.reader, self.run = proms, reader, run
        self.fired: list[tuple[str, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            for name, prom in self.proms.items():
                try:
                    self.fired += [(name, a) for a in firing(prom, self.run)]
                except (OSError, RuntimeError):
                    pass  # a busy moment: the next read counts
            try:
                self.reader.read()
            except (OSError, RuntimeError):
                pass

    def accused(self) -> list[tuple[str, int, str]]:
        return [
            (mode, rank, verdict)
            for mode, tables in self.reader.tables.items()
            for table in tables
            for rank, verdict in table.items()
            if verdict.startswith(top.ACCUSATIONS)
        ]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _job(tmp_path: Path, run: str, args: list[str], extra: list[str] | None = None) -> Job:
    env = {
        "OMP_NUM_THREADS": "1",
        # torch 2.13: a restarted attempt reads its predecessor's rendezvous keys from the agent's
        # shared store and cannot connect (pytorch/pytorch#167288); a store per attempt works.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "DDP_EXPORTER_RUN": run,
        "DDP_EXPORTER_DUMP_DIR": str(tmp_path / "dumps"),
        "DDP_EXPORTER_FILE_SD": str(tmp_path / "file_sd"),
    }
    return Job(RANKS, [str(tmp_path / "go"), *args], env=env, module=WORKER, torchrun=extra)


def test_a_whole_job_life_pages_nobody(tmp_path):
    require("prometheus")
    run = "life"
    # Rank 0 checkpoints for 30 s (3x the stall threshold) and evaluates for 20 s, each inside a
    # declared section with a 120 s deadline, while the others wait in the next allreduce.
    args = ["--steps", "100", "--checkpoint", "30:120", "--eval", "20:120"]
    with _job(tmp_path, run, args) as job:
        urls = job.wait_urls()
        with (
            run_prometheus(tmp_path / "sd", fast_config(tmp_path / "sd", sd_scrape(urls[0]))) as sd,
            run_prometheus(
                tmp_path / "fsd",
                fast_config(tmp_path / "fsd", file_sd_scrape(tmp_path / "file_sd"), "800ms"),
            ) as fsd,
            run_prometheus(
                tmp_path / "st", fast_config(tmp_path / "st", static_scrape(urls), "700ms")
            ) as st,
        ):
            proms = {"/sd": sd, "file_sd": fsd, "static": st}
            for prom in proms.values():
                wait_for(lambda p=prom: len(p.targets_up()) == RANKS, 60, "every rank scraped")
            watch = Watch(proms, TopReader([urls[r] for r in range(RANKS)], sd.url, run), run)
            try:
                (tmp_path / "go").touch()
                wait_for(lambda: "rank 0: checkpoint done" in job.text(), 120, "the checkpoint")
                wait_for(lambda: "rank 0: evaluation done" in job.text(), 120, "the evaluation")
                assert job.wait(180) == 0, job.output()
                ended = time.monotonic()
                wait_for(
                    lambda: time.monotonic() - ended > AFTER_END_S,
                    AFTER_END_S + 10,
                    "two minutes after the end",
                )
                # What Prometheus still knows of the ended job: every rank finished cleanly.
                finished = sd.query(
                    f'last_over_time(ddp_finished_timestamp_seconds{{run="{run}"}}[5m])'
                )
            finally:
                watch.stop()
            assert not watch.fired, watch.fired
            assert not watch.accused(), watch.accused()
            assert len(finished) == RANKS, finished
            tables = watch.reader.tables
            assert all(v.startswith("finished") for v in tables["targets"][-1].values()), tables[
                "targets"
            ][-1]
            for prom in proms.values():
                assert not prom.query(f'ALERTS{{run="{run}"}}'), "an alert is still pending"
    assert not glob.glob(str(tmp_path / "dumps" / "*-hang-*")), "a hang dump was written"


def test_an_overrunning_checkpoint_is_overdue_then_names_rank_0(tmp_path):
    require("prometheus")
    run = "overrun"
    # The checkpoint takes 60 s against a 15 s deadline: overdue at 15 s, then a hang with rank
    # 0 behind (the others wait in the allreduce past the stall threshold).
    with _job(tmp_path, run, ["--steps", "60", "--checkpoint", "60:15"]) as job:
        urls = job.wait_urls()
        with run_prometheus(
            tmp_path / "sd", fast_config(tmp_path / "sd", sd_scrape(urls[0]))
        ) as prom:
            wait_for(lambda: len(prom.targets_up()) == RANKS, 60, "every rank scraped")
            (tmp_path / "go").touch()
            wait_for(lambda: "rank 0: checkpoint" in job.text(), 60, "the checkpoint to start")
            overdue = wait_for(
                lambda: [a for a in firing(prom, run) if a["alertname"] == "DDPSectionOverdue"],
                60,
                "DDPSectionOverdue",
            )
            assert [(a["rank"], a["section"]) for a in overdue] == [("0", "checkpoint")]
            stalled = wait_for(
                lambda: [a for a in firing(prom, run) if a["alertname"] == "DDPCollectiveStalled"],
                60,
                "DDPCollectiveStalled",
            )
            assert [(a["rank"], a["role"]) for a in stalled] == [("0", "behind")], stalled


def test_a_killed_job_is_one_alert_for_the_run(tmp_path):
    require("prometheus")
    run = "killed"
    job = _job(tmp_path, run, ["--steps", "50", "--forever"])
    try:
        urls = job.wait_urls()
        with run_prometheus(
            tmp_path / "sd", fast_config(tmp_path / "sd", sd_scrape(urls[0]))
        ) as prom:
            wait_for(lambda: len(prom.targets_up()) == RANKS, 60, "every rank scraped")
            (tmp_path / "go").touch()
            wait_for(lambda: prom.query(f'ddp_steps_total{{run="{run}"}} > 20'), 60, "training")
            job.stop()  # torchrun and its ranks die: no rank ends cleanly
            killed = wait_for(
                lambda: [a for a in firing(prom, run) if a["alertname"] == "DDPJobKilled"],
                90,
                "DDPJobKilled",
            )
            assert [a.get("rank") for a in killed] == [None], killed
            # For twice the time a per-rank alert needs to fire (rank_down_for), none does.
            until = time.monotonic() + 25
            while time.monotonic() < until:
                names = [a["alertname"] for a in firing(prom, run)]
                assert names == ["DDPJobKilled"], names
                time.sleep(1.0)
    finally:
        job.stop()


def test_a_restarted_attempt_continues_the_run(tmp_path):
    require("prometheus")
    run = "restarted"
    base = free_port(RANKS)
    # Rank 1 raises at step 20 of attempt 0; torchrun restarts the group once; attempt 1 trains
    # on the same ports, then ends cleanly.
    args = ["--steps", "200", "--fail", "1:20", "--port", str(base)]
    restarts = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--max-restarts",
        "1",
    ]
    with _job(tmp_path, run, args, extra=restarts) as job:
        urls = job.wait_urls()
        with run_prometheus(
            tmp_path / "fsd", fast_config(tmp_path / "fsd", file_sd_scrape(tmp_path / "file_sd"))
        ) as prom:
            wait_for(lambda: len(prom.targets_up()) == RANKS, 60, "every rank scraped")
            (tmp_path / "go").touch()
            wait_for(lambda: job.text().count("attempt 1") == RANKS, 120, "the restarted attempt")
            (tmp_path / "go").touch()
            info = f'ddp_rank_info{{run="{run}", attempt="1"}}'
            attempts = wait_for(
                lambda: len(prom.query(info)) == RANKS and prom.query(info),
                60,
                "attempt 1's series under the same run",
            )
            assert sorted(s["metric"]["rank"] for s in attempts) == ["0", "1", "2"]
            assert job.wait(180) == 0, job.output()
            # Once attempt 1 reported, nothing of attempt 0 is left firing.
            names = [a["alertname"] for a in firing(prom, run)]
            assert not names, names
    assert urls  # the same endpoints served both attempts
