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
import urllib.request

import pytest
from harness import Ranks, wait_for
from promstack import Prometheus, require, run_prometheus

pytestmark = pytest.mark.stack

WORLD = 3
JOB_ID = "4242"


@pytest.fixture
def ranks(tmp_path):
    require("prometheus")
    env = {
        "OMP_NUM_THREADS": "1",
        "SLURM_JOB_ID": JOB_ID,
        "DDP_EXPORTER_FILE_SD": str(tmp_path / "file_sd"),
    }
    per_rank = {r: {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in range(WORLD)}
    cmd = ["-m", "exporter.tools.trainer", "--duration", "0", "--port", "0"]
    cmd += ["--addr", "127.0.0.1", "--heartbeat", "1", "--step-time", "0.1"]
    with Ranks(WORLD, cmd, env=env, per_rank=per_rank) as started:
        yield started


def _sigkill(ranks: Ranks, rank: int) -> None:
    """SIGKILL one rank (by pid) and reap it: it dies without a clean exit."""
    proc = ranks.procs[rank].proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


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
        dead = [r for r, p in ranks.procs.items() if p.poll() is not None]
        assert not dead, ranks.output()
        return len(ranks.urls) == WORLD

    wait_for(all_urls, 180, "every rank to announce its metrics URL")
    urls = ranks.urls
    sd_url = urls[0].replace("/metrics", "/sd")
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
            assert target["scrapeUrl"] == urls[int(rank)]
        wait_for(
            lambda: len(prom.query(f'ddp_steps_total{{run="{JOB_ID}"}} > 0')) == WORLD,
            60,
            "training steps of every rank in Prometheus",
        )

        failures = _self_metric(prom, "prometheus_sd_http_failures_total")
        _sigkill(ranks, 0)  # the monitoring rank: /sd is gone with it
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
