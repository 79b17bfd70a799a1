"""A real 2-rank torchrun job under a real Prometheus with the FAST rules: sections and deadlines.

One job serves every assertion (see tests/workers/clock_worker.py): an asynchronous checkpoint
that overruns its deadline fires DDPSectionOverdue while it is still running; an eval section
that finishes in time stays silent; a SLURM_JOB_END_TIME the job cannot meet fires
DDPJobWillMissDeadline with the shortfall, and one it can meet stays silent.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness import value, wait_for
from worker_job import WorkerJob, fast_prometheus, firing

from exporter.mixin.config import FAST
from exporter.mixin.rules import recorded

pytestmark = pytest.mark.stack

ENV: dict[str, str] = {}


def test_overdue_section_and_job_deadline_alerts(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    with WorkerJob(2, "clock_worker.py", [str(stop)], ENV) as job:
        urls = job.wait_urls()
        with fast_prometheus(tmp_path / "prom", urls) as prom:
            # The checkpoint section was entered before instrument() and is still running.
            overdue = wait_for(
                lambda: firing(prom, "DDPSectionOverdue"), 120, "DDPSectionOverdue to fire"
            )
            assert "checkpoint done" not in job.output(), "the alert came after the section ended"
            s1 = job.scrape(1)
            started = value(s1, "ddp_section_started_timestamp_seconds", section="checkpoint")
            assert value(s1, "ddp_section_deadline_seconds", section="checkpoint") == 2.0
            assert time.time() - started > 2.0
            assert [
                (a["labels"]["run"], a["labels"]["rank"], a["labels"]["section"]) for a in overdue
            ] == [("late", "1", "checkpoint")]

            late = wait_for(
                lambda: firing(prom, "DDPJobWillMissDeadline"),
                120,
                "DDPJobWillMissDeadline to fire",
            )
            assert [(a["labels"]["run"], a["labels"]["rank"]) for a in late] == [("late", "1")]
            shortfall = float(late[0]["value"])
            assert shortfall > 3600, shortfall  # a million steps cannot fit in two minutes
            assert "after its wall-clock deadline" in late[0]["annotations"]["description"]

            # The run that fits was projected all along, before its deadline minus the margin,
            # and never even went pending.
            r = recorded(FAST)
            fits = prom.query(f'{r.projected_finish_run}{{run="fits"}}')
            deadline = prom.query('ddp_job_deadline_timestamp_seconds{run="fits"}')
            assert fits and deadline, (fits, deadline)
            margin = FAST.job_deadline_margin_seconds
            assert float(fits[0]["value"][1]) < float(deadline[0]["value"][1]) - margin
            assert prom.query('ALERTS{alertname="DDPJobWillMissDeadline", run="fits"}') == []

            # The eval section ran (more than once) within its deadline: silent.
            s0 = wait_for(
                lambda: (
                    (s := job.scrape(0))
                    and value(s, "ddp_section_runs_total", section="eval") >= 2
                    and s
                ),
                60,
                "two eval sections on rank 0",
            )
            assert value(s0, "ddp_section_last_duration_seconds", section="eval") < 30
            assert not s0.get("ddp_section_started_timestamp_seconds")
            assert prom.query('ALERTS{alertname="DDPSectionOverdue", section="eval"}') == []
            assert value(s0, "ddp_job_total_steps") == 600
            info = s0["ddp_rank_info"][0][0]
            assert info["python_version"] and info["cuda_version"] and info["nccl_version"]

        stop.touch()
        assert job.wait(60) == 0, job.output()
    assert "rank 1: checkpoint done" in job.output()
