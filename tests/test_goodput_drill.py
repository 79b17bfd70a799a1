"""The goodput drill: one real job loses time every way, and its account says where, to the second.

A torchrun job on gloo (tests/workers/goodput_worker.py, ``--max-restarts 1``, the hang action
on): a healthy start, rank 1 straggling for a while, a declared checkpoint on rank 0, healthy
steps, rank 2 stuck in user code until the hang action aborts the run, the restart resuming
from the checkpoint (redoing the steps after it), a normal end. A real Prometheus with the
FAST rules scrapes it throughout. The worker measures each period on its own clock; the run's
account (its goodput file, and Prometheus through ``ddp-exporter goodput``) must put each in its
category, and add up to the wall clock.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import pytest
from harness import Job, wait_for
from promstack import fast_config, firing, require, run_prometheus, static_scrape

from exporter.mixin.config import FAST
from exporter.mixin.rules import recorded
from exporter.sources.goodput import CATEGORIES, goodput_path, summary_path
from exporter.tools.goodput import fetch_account
from exporter.tools.localstack import free_port

pytestmark = pytest.mark.stack

WORKER = os.path.join("tests", "workers", "goodput_worker.py")
RANKS = 3
RUN = "goodput-drill"
#: The worker's step boundaries (tests/workers/goodput_worker.py).
CHECKPOINT, HANG = 120, 200


def _measures(text: str) -> dict[str, float]:
    return {m[0]: float(m[1]) for m in re.findall(r"measure (\w+) ([\d.e+-]+)", text)}


def _near(got: float, want: float, share: float = 0.10, floor_s: float = 2.0) -> bool:
    """Say whether ``got`` is within ``share`` of ``want`` or ``floor_s`` seconds of it."""
    return abs(got - want) <= max(share * want, floor_s)


# Timing goals: another job's CPU load would change the step times the account is held to.
@pytest.mark.solo
def test_every_lost_second_lands_in_its_category(tmp_path: Path) -> None:
    require("prometheus")
    dumps = tmp_path / "dumps"
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_RUN": RUN,
        "DDP_EXPORTER_DUMP_DIR": str(dumps),
        "DDP_EXPORTER_ON_HANG": "abort",
        "DDP_EXPORTER_HEARTBEAT_S": "1",
    }
    args = [str(tmp_path), "--port", str(free_port(RANKS))]
    started = time.monotonic()
    with Job(
        RANKS, args, env=env, module=WORKER, torchrun=["--standalone", "--max-restarts", "1"]
    ) as job:
        urls = job.wait_urls()
        prom_dir = tmp_path / "prom"
        with run_prometheus(prom_dir, fast_config(prom_dir, static_scrape(urls))) as prom:
            assert job.wait(240) == 0, job.output()
            took = time.monotonic() - started
            # What Prometheus kept of the account, through the restart: the command's table.
            # The job has ended: its series are stale now, what the rules recorded is not lost.
            ettr = f'last_over_time({recorded(FAST).ettr}{{run="{RUN}"}}[5m])'
            wait_for(lambda: prom.query(ettr), 30, "the run's ETTR recorded")
            seen = fetch_account(prom.url, RUN)
    text = job.text()
    measured = _measures(text)
    with open(goodput_path(str(dumps), RUN)) as f:
        doc = json.load(f)
    totals = doc["totals"]
    report = json.dumps(
        {
            "measured": measured,
            "account": totals,
            "took_s": took,
            "stragglers": doc["stragglers"],
            "blame": doc["blame"],
        },
        indent=1,
    )
    print(f"\n{report}")

    # The categories add up to the wall clock the worker measured, within 2 %.
    wall = measured["end"] - measured["begin"]
    assert abs(sum(totals.values()) - wall) <= 0.02 * wall, report
    assert doc["ended"] == "clean" and doc["attempts"] == ["0", "1"], doc
    assert totals["other"] <= max(0.02 * wall, 2.0), report

    # Each injected period in its category, within 10 % or 2 s.
    host = socket.gethostname()
    assert _near(totals["straggler"], measured["straggler"]), report
    blame = {(b["category"], b["culprit_rank"]): b for b in doc["blame"]}
    assert blame[("straggler", 1)]["node"] == host, doc["blame"]
    assert blame[("straggler", 1)]["seconds"] >= 0.9 * totals["straggler"], doc["blame"]
    assert _near(totals["checkpoint"], measured["checkpoint"]), report
    with open(next(dumps.glob("*-hang-*/episode.json"))) as f:
        aborted = json.load(f)["action"]["decided_unix"]
    assert _near(totals["hang"], aborted - measured["onset"]), report
    assert blame[("hang", 2)]["node"] == host, doc["blame"]
    assert _near(totals["restart"], measured["first_step"] - aborted), report
    # Lost work: the steps redone after resuming from the checkpoint, at the pace they were
    # redone (on a busy host the second attempt's steps are slower than the first's).
    redone = HANG - CHECKPOINT
    assert abs(totals["lost_work"] - redone * measured["redo_step"]) <= (
        0.10 * redone * measured["redo_step"]
    ), report
    (hang,) = doc["hangs"]
    assert (hang["culprit_rank"], hang["how"]) == (2, "aborted"), doc["hangs"]
    assert [e["culprit_rank"] for e in doc["stragglers"]] == [1], doc["stragglers"]

    # The summary next to the dumps says the same; Prometheus kept the same account.
    with open(summary_path(str(dumps), RUN)) as f:
        summary = f.read()
    assert "straggler episode: rank 1" in summary and "hang episode: rank 2" in summary, summary
    for cat in CATEGORIES:
        assert abs(seen["totals"][cat] - totals[cat]) <= max(0.02 * totals[cat], 0.5), (
            cat,
            seen["totals"],
            totals,
        )


# Not solo: rank 1's straggle triples its step. Another job's load can only lower the run's ETTR
# further; it cannot make a healthy rank cost the run more than rank 1 does.
def test_a_straggler_that_costs_more_than_the_threshold_pages_naming_it(tmp_path: Path) -> None:
    """DDPGoodputLow fires for a run whose straggler costs more than the threshold, naming the
    rank and its node. (Its silence over a healthy job's whole life is tests/test_lifecycle.py's:
    no alert at all may fire there.)"""
    require("prometheus")
    run = "goodput-straggler"
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_RUN": run,
        "DDP_EXPORTER_HEARTBEAT_S": "1",
        "DDP_EXPORTER_DUMP_DIR": str(tmp_path / "dumps"),
    }
    # Rank 1 adds 0.1 s to steps of ~0.05 s from step 20 on: the others wait most of the time.
    args = [
        str(tmp_path),
        "--port",
        str(free_port(RANKS)),
        "--steps",
        "100000",
        "--straggle-steps",
        "20:100000",
        "--no-checkpoint",
        "--no-hang",
    ]
    with Job(RANKS, args, env=env, module=WORKER, torchrun=["--standalone"]) as job:
        urls = job.wait_urls()
        prom_dir = tmp_path / "prom"
        with run_prometheus(prom_dir, fast_config(prom_dir, static_scrape(urls))) as prom:
            # FAST: a one-minute window, 30 s pending.
            alerts = wait_for(
                lambda: [a for a in firing(prom, run) if a["alertname"] == "DDPGoodputLow"],
                240,
                "DDPGoodputLow firing",
                interval=1.0,
            )
            ettr = prom.query(f'{recorded(FAST).unplanned_ettr}{{run="{run}"}}')
    (alert,) = alerts
    assert alert["category"] == "straggler", alert
    assert (alert["culprit_rank"], alert["node"]) == ("1", socket.gethostname()), alert
    assert ettr and float(ettr[0]["value"][1]) < FAST.goodput_min_ettr, ettr
