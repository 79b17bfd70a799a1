"""Know when to stop: a run's ledger of hang aborts, and the restart-loop drill.

The unit half judges attempts against a ledger (progress, the streak, the decision), chains a
ledger to the attempt that reads it and writes the launcher's line. The drill runs
tests/workers/restart_worker.py under ``torchrun --standalone --max-restarts 3`` with rank 1
stuck at step 110 in EVERY attempt (a culprit that stays broken), checkpoints every 20 steps, a
real Prometheus with the FAST rules: exactly 3 aborts (75, 75, then 69: do not requeue), then
DDPRestartLoop, and the fourth attempt's hang is dumped but not aborted.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from harness import Job, Ranks, wait_for
from promstack import fast_config, require, run_prometheus, static_scrape

import exporter.tools.top as top
from exporter import settings
from exporter.hangs import restarts
from exporter.hangs.protocol import LedgerEntry
from exporter.hangs.restarts import RestartPolicy
from exporter.tools.localstack import free_port

WORKER = os.path.join("tests", "workers", "restart_worker.py")
HOST = socket.gethostname()
POLICY = RestartPolicy(limit=3, progress_steps=50, give_up_exit_code=69)


def _entry(attempt: int, furthest: int, streak: int, decision: str = "abort") -> LedgerEntry:
    return LedgerEntry(
        run="r",
        attempt=attempt,
        episode=1,
        decision=decision,
        exit_code=None,
        progress=False,
        streak=streak,
        furthest=furthest,
        steps=0,
        start_step=None,
        culprits=(1,),
        nodes=("bad",),
        folder="",
        decided_unix=0.0,
    )


# -- the ledger's judgement ---------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(
    ("chain", "start", "steps", "want"),
    [
        ([], None, 110, (110, True, 1, "abort")),  # the run's first abort: nothing to compare
        ([_entry(0, 110, 1)], 100, 10, (110, False, 2, "abort")),  # resumed, hung at 110 again
        ([_entry(0, 110, 1), _entry(1, 110, 2)], 100, 10, (110, False, 3, "give_up")),
        (
            [_entry(0, 110, 1), _entry(1, 110, 2), _entry(2, 110, 3, "give_up")],
            100,
            12,
            (112, False, 4, "decline"),
        ),  # the action stopped
        ([_entry(0, 110, 1), _entry(1, 110, 2)], 100, 70, (170, True, 1, "abort")),  # progress
        ([_entry(0, 110, 1)], None, 30, (140, False, 2, "abort")),  # start unknown: 30 < 50
        ([_entry(0, 110, 1)], None, 60, (170, True, 1, "abort")),  # start unknown: 60 steps
        ([_entry(0, 5000, 1)], 4000, 900, (4900, False, 2, "abort")),  # a shorter attempt
    ],
    ids=[
        "first",
        "again",
        "limit",
        "past-limit",
        "progress",
        "unknown-short",
        "unknown-long",
        "behind-best",
    ],
)
def test_judge_progress_streak_and_decision(chain, start, steps, want):
    got = restarts.judge(chain, POLICY, start_step=start, steps=steps)
    assert (got.furthest, got.progress, got.streak, got.decision) == want


@pytest.mark.unit
def test_a_limit_of_zero_never_stops():
    chain = [_entry(a, 110, a + 1) for a in range(7)]
    got = restarts.judge(chain, RestartPolicy(limit=0), start_step=100, steps=10)
    assert (got.streak, got.decision) == (8, "abort")


@pytest.mark.unit
def test_the_ledger_chains_only_to_the_attempt_before(tmp_path: Path):
    d = str(tmp_path)
    assert restarts.load_entries(d, "r", "1") == []  # no ledger yet
    chain: list[LedgerEntry] = []
    for attempt in range(3):
        entry = replace(_entry(attempt, 110, attempt + 1), decided_unix=1.0)
        restarts.record(d, "r", chain, entry)
        chain = restarts.load_entries(d, "r", str(attempt + 1))
        assert [e.attempt for e in chain] == list(range(attempt + 1))
    assert oct(os.stat(restarts.ledger_path(d, "r")).st_mode & 0o777) == "0o600"
    assert restarts.load_entries(d, "r", "0") == []  # a new job reusing the name starts afresh
    assert restarts.load_entries(d, "r", "5") == []  # attempts 3 and 4 ended otherwise
    assert restarts.load_entries(d, "other", "3") == []
    # A new job's first abort replaces the old run's ledger whole.
    restarts.record(d, "r", [], _entry(0, 20, 1))
    assert [e.furthest for e in restarts.load_entries(d, "r", "1")] == [20]
    (tmp_path / "bad-restarts.json").write_text("{not json")
    with pytest.raises(ValueError):
        restarts.load_entries(d, "bad", "1")


@pytest.mark.unit
def test_the_launcher_line_says_whether_to_requeue_and_where_the_culprit_is():
    entry = replace(_entry(2, 110, 3, "give_up"), exit_code=69, folder="d/r-attempt-2-hang-1")
    assert restarts.launcher_line(entry, 3) == (
        "requeue=no exit_code=69 attempt=2 aborts_without_progress=3 limit=3 culprit_ranks=1 "
        "culprit_nodes=bad folder=d/r-attempt-2-hang-1\n"
    )
    entry = replace(entry, decision="abort", exit_code=75, culprits=(), nodes=())
    line = restarts.launcher_line(entry, 3)
    assert line.startswith("requeue=yes exit_code=75 ") and "culprit_ranks=none " in line


@pytest.mark.unit
def test_the_published_state_rearms_once_the_attempt_gets_past_the_mark():
    chain = [_entry(0, 110, 1), _entry(1, 110, 2), _entry(2, 110, 3, "give_up")]
    state = restarts.RestartState(POLICY, chain, start_step=100)
    assert state.suspended and state.streak == 3
    assert [a[0] for a in state.attempts()] == ["0", "1", "2"]
    assert not state.progressed(50)  # 150 < 110 + 50
    assert state.streak == 3
    assert state.progressed(60)  # 160: the action acts again
    assert not state.suspended and state.streak == 0


# -- the drill ------------------------------------------------------------------------------------
@pytest.mark.stack
def test_a_culprit_that_hangs_every_attempt_is_aborted_exactly_limit_times(tmp_path: Path):
    require("prometheus")
    run = "loop"
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_RUN": run,
        "DDP_EXPORTER_ON_HANG": "abort",
        "DDP_EXPORTER_HEARTBEAT_S": "1",
        "DDP_EXPORTER_DUMP_DIR": str(tmp_path / "dumps"),
    }
    args = [str(tmp_path), "--stuck-always", "1:110", "--steps", "300", "--port", str(free_port(3))]
    torchrun = ["--standalone", "--max-restarts", "3"]
    with Job(3, args, env=env, module=WORKER, torchrun=torchrun) as job:
        urls = job.wait_urls()
        prom_dir = tmp_path / "prom"
        with run_prometheus(prom_dir, fast_config(prom_dir, static_scrape(urls))) as prom:
            # Attempts 0, 1, 2 abort; attempt 3 hangs at step 110 again and the action declines.
            wait_for(lambda: job.seen("ddp-exporter: NOT aborting"), 300, "the declined hang")
            loop = wait_for(
                lambda: [
                    a
                    for a in prom.api("alerts")["alerts"]
                    if a["labels"]["alertname"] == "DDPRestartLoop" and a["state"] == "firing"
                ],
                60,
                "DDPRestartLoop",
            )
            # top, reading attempt 3's endpoints, says the loop too.
            line = top.restart_line(top.fetch(list(urls.values())))
            assert job.poll() is None, job.output()  # the hung attempt is left to its timeout
    text = job.text()
    lines = [x for x in text.splitlines() if "ddp-exporter: aborting run" in x]
    assert len(lines) == 9, text  # 3 ranks x 3 aborts, and no fourth
    assert sum("this is the last abort" in x and "code 69" in x for x in lines) == 3, lines
    assert text.count("exitcode: 75") >= 2 and "exitcode: 69" in text, text
    assert "attempt 3 resumed at step 100" in text and "finished at step" not in text

    with open(tmp_path / "dumps" / f"{run}-restarts.json") as f:
        ledger = json.load(f)["attempts"]
    assert [(e["attempt"], e["decision"], e["streak"], e["furthest"]) for e in ledger] == [
        (0, "abort", 1, 110),
        (1, "abort", 2, 110),
        (2, "give_up", 3, 110),
        (3, "decline", 4, 110),
    ]
    assert all(e["culprits"] == [1] and e["nodes"] == [HOST] for e in ledger), ledger
    with open(tmp_path / "dumps" / f"{run}-abort.txt") as f:
        assert f.read().startswith(
            f"requeue=no exit_code=69 attempt=2 aborts_without_progress=3 limit=3 "
            f"culprit_ranks=1 culprit_nodes={HOST} folder="
        )
    # Each attempt's dumps in a folder of its own; the declined one records no action.
    folders = sorted(p.name for p in (tmp_path / "dumps").glob("*-hang-*"))
    assert folders == [f"{run}-attempt-{a}-hang-1" for a in (1, 2, 3)] + [f"{run}-hang-1"]
    with open(tmp_path / "dumps" / f"{run}-attempt-3-hang-1" / "verdict.txt") as f:
        assert "ACTION: none: " in f.read()

    (alert,) = loop
    assert alert["labels"]["run"] == run and alert["labels"]["severity"] == "critical"
    for attempt in (0, 1, 2):
        assert (
            f"attempt {attempt}: rank 1 on node {HOST}, furthest step 110;"
            in (alert["annotations"]["description"])
        ), alert
    assert line.startswith("restarts: attempt 3; hang aborts without progress 4 of 3"), line
    assert line.endswith("RESTART LOOP: the hang action stopped"), line


@pytest.mark.job
def test_a_resubmitting_script_continues_the_ledger_with_the_attempt_offset(tmp_path: Path):
    """One process per rank (srun), each "job" a new one: the script passes the attempt on.

    What docs/slurm.md's resubmitting script does: read ``<run>-abort.txt``, resubmit while it
    says ``requeue=yes``, with ``DDP_EXPORTER_ATTEMPT`` one past the aborted attempt. Limit 2:
    the second job's abort is the last (69, requeue=no).
    """
    assert settings.attempt({settings.ATTEMPT: "2", "SLURM_RESTART_COUNT": "1"}) == "3"
    assert settings.attempt({settings.ATTEMPT: "-1"}) == "0"  # not a count: logged, default
    run = "resubmitted"
    line_file = tmp_path / "dumps" / f"{run}-abort.txt"
    attempt, seen = 0, []
    for _ in range(2):
        env = {
            "OMP_NUM_THREADS": "1",
            "DDP_EXPORTER_RUN": run,
            "DDP_EXPORTER_ON_HANG": "abort",
            "DDP_EXPORTER_HEARTBEAT_S": "1",
            "DDP_EXPORTER_ABORT_LIMIT": "2",
            "DDP_EXPORTER_DUMP_DIR": str(tmp_path / "dumps"),
            settings.ATTEMPT: str(attempt),
        }
        cmd = [WORKER, str(tmp_path), "--stuck-always", "2:110", "--steps", "300"]
        with Ranks(3, cmd, env=env) as job:
            codes = job.wait(150)
        line = line_file.read_text()
        seen.append((codes, line.split()[0]))
        attempt = int(line.split(" attempt=")[1].split()[0]) + 1
    assert seen == [({0: 75, 1: 75, 2: 75}, "requeue=yes"), ({0: 69, 1: 69, 2: 69}, "requeue=no")]
    ledger = restarts.load_entries(str(tmp_path / "dumps"), run, "2")
    assert [(e.attempt, e.decision, e.nodes) for e in ledger] == [
        (0, "abort", (HOST,)),
        (1, "give_up", (HOST,)),
    ]
