"""A real Prometheus finds every rank through ``/sd`` on the monitoring rank, launched as srun does.

Three ranks run ``exporter.tools.trainer`` one process each, with the environment srun + a per-task
launch give them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, SLURM_JOB_ID; no torchrun).
Prometheus has a single ``http_sd_configs`` URL, rank 0's ``/sd``. The test checks that every
rank is discovered and scraped with its run (the Slurm job id) and rank labels, then SIGKILLs
rank 0 and checks that Prometheus keeps every target although ``/sd`` is gone: the dead
monitoring rank is a target that is down (so DDPRankDown can fire), the others stay up. The
ranks also write file_sd files (``DDP_EXPORTER_FILE_SD``), checked against what /sd served.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest
from harness import REPO, wait_for
from promstack import Prometheus, free_port, require, run_prometheus

from exporter.tools.demo import metrics_urls

WORLD = 3
JOB_ID = "4242"


class Rank:
    """One rank process started like an srun task, killed by pid at the end."""

    def __init__(self, rank: int, master_port: int, file_sd: str) -> None:
        environ = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TORCHELASTIC_", "DDP_EXPORTER_", "SLURM_"))
        }
        environ.update(
            PYTHONPATH=REPO + os.pathsep + environ.get("PYTHONPATH", ""),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            LOCAL_WORLD_SIZE=str(WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
            SLURM_JOB_ID=JOB_ID,
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            DDP_EXPORTER_FILE_SD=file_sd,
        )
        cmd = [sys.executable, "-m", "exporter.tools.trainer", "--duration", "0", "--port", "0"]
        cmd += ["--addr", "127.0.0.1", "--heartbeat", "1", "--step-time", "0.1"]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environ,
            cwd=REPO,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.url: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.url = self.url or next(iter(metrics_urls(line).values()), None)

    def kill(self) -> None:
        """SIGKILL the process (by pid) and reap it."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def ranks(tmp_path):
    require("prometheus")
    port = free_port()
    started = [Rank(r, port, str(tmp_path / "file_sd")) for r in range(WORLD)]
    try:
        yield started
    finally:
        for rank in started:
            rank.kill()


def _self_metric(prom: Prometheus, name: str) -> float:
    """Return the sum of one of Prometheus's own counters, read from its /metrics."""
    with urllib.request.urlopen(f"{prom.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    )


def _targets(prom: Prometheus) -> dict[str, dict]:
    """Return the active targets by rank label."""
    active = prom.api("targets", state="active")["activeTargets"]
    return {t["labels"].get("rank", "?"): t for t in active}


def test_prometheus_discovers_every_srun_rank_through_sd_and_keeps_them(ranks, tmp_path):
    def all_urls():
        dead = [r for r in ranks if r.proc.poll() is not None]
        assert not dead, "".join(dead[0].lines)
        return all(r.url for r in ranks)

    wait_for(all_urls, 180, "every rank to announce its metrics URL")
    sd_url = ranks[0].url.replace("/metrics", "/sd")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "ddp",
                "honor_labels": True,
                "http_sd_configs": [{"url": sd_url, "refresh_interval": "1s"}],
            }
        ],
    }
    with run_prometheus(tmp_path / "prom", config) as prom:
        wait_for(lambda: len(prom.targets_up()) == WORLD, 120, "Prometheus to scrape every rank up")
        targets = _targets(prom)
        assert sorted(targets) == ["0", "1", "2"]
        for rank, target in targets.items():
            labels = target["labels"]
            assert labels["run"] == JOB_ID and labels["job"] == "ddp"
            assert labels["local_rank"] == rank and labels["node"]
            assert target["scrapeUrl"] == ranks[int(rank)].url
        wait_for(
            lambda: len(prom.query(f'ddp_steps_total{{run="{JOB_ID}"}} > 0')) == WORLD,
            60,
            "training steps of every rank in Prometheus",
        )

        failures = _self_metric(prom, "prometheus_sd_http_failures_total")
        ranks[0].kill()  # the monitoring rank: /sd is gone with it
        wait_for(
            lambda: _self_metric(prom, "prometheus_sd_http_failures_total") >= failures + 3,
            60,
            "three failed /sd refreshes",
        )
        wait_for(
            lambda: _targets(prom).get("0", {}).get("health") == "down",
            30,
            "the dead monitoring rank's target to be down",
        )
        targets = _targets(prom)
        assert sorted(targets) == ["0", "1", "2"], "Prometheus dropped discovered targets"
        # The survivors are still scraped (a wait: one slow scrape on a loaded machine is down).
        wait_for(
            lambda: [_targets(prom)[r]["health"] for r in "12"] == ["up", "up"],
            30,
            "ranks 1 and 2 to be scraped after rank 0 died",
        )
        # DDP_EXPORTER_FILE_SD: each rank wrote the same target group to its own file; the
        # killed rank's file stays (its target must keep paging), nothing half-written is left.
        sd_dir = tmp_path / "file_sd"
        names = sorted(os.listdir(sd_dir))
        assert names == [f"ddp-{JOB_ID}-rank-{r}.json" for r in range(WORLD)]
        for r, name in enumerate(names):
            (group,) = json.loads((sd_dir / name).read_text())
            assert group["targets"] == [targets[str(r)]["labels"]["instance"]]
            assert group["labels"] == {
                k: targets[str(r)]["labels"][k] for k in ("run", "rank", "local_rank", "node")
            }
        wait_for(
            lambda: prom.query(f'up{{job="ddp", run="{JOB_ID}", rank="0"}} == 0'),
            30,
            "up == 0 for the dead rank",
        )
