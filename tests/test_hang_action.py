"""Act on a hang: every rank exits, the launcher restarts the job from its checkpoint.

Real torchrun (``--max-restarts 1``) and one-process-per-rank jobs of
tests/workers/restart_worker.py on gloo with a 30-minute process-group timeout, a real
Prometheus with the FAST rules. The healthy edges are tested as hard as the fault: a slow start,
a straggler whose hang dump is written but who then progresses, and a long declared checkpoint
never trigger the action; with the action off a hang behaves as before (dumps, nobody exits).
How fast the restart is belongs to benchmarks/restart.py.
"""

from __future__ import annotations

import datetime
import glob
import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import train_epoch
from harness import Job, Ranks, parse, scrape_text, wait_for
from promstack import fast_config, require, run_prometheus, static_scrape

import exporter
from exporter import settings, storekeys
from exporter.errors import ErrorCounter
from exporter.hangs import action, codec
from exporter.hangs.definition import HangFinding
from exporter.hangs.protocol import DumpRequest, Episode, Located, Summary
from exporter.settings import validate
from exporter.tools.localstack import free_port

WORKER = os.path.join("tests", "workers", "restart_worker.py")
RANKS = 3
HOST = socket.gethostname()
ABORT_LINE = "ddp-exporter: aborting run"


def _env(tmp_path: Path, run: str, **extra: str) -> dict[str, str]:
    return {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_RUN": run,
        "DDP_EXPORTER_DUMP_DIR": str(tmp_path / "dumps"),
        **extra,
    }


def _restarts() -> list[str]:
    # What people type: torchrun's agent store is shared by every attempt (tests/test_launcher.py
    # runs every other launch form).
    return ["--standalone", "--max-restarts", "1"]


def _episodes(tmp_path: Path) -> list[str]:
    return sorted(glob.glob(str(tmp_path / "dumps" / "*-hang-*")))


def _line_of(marker: str) -> int:
    with open(WORKER) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line)


# -- the decision, on its own -------------------------------------------------------------------
#: The monitoring rank's dump request (the episode's first fields too).
REQUEST = DumpRequest(1, "0", "behind", 36.0, behind=(1,), threshold=10.0)
STEPS = {0: 30, 1: 30, 2: 30}


def _opened(**change) -> Episode:
    """Return the episode of the request (with ``change``) as the monitoring rank opens it."""
    return Episode(replace(REQUEST, **change), run="r")


def _finding(kind: str = "behind", seq: float = 36.0, age: float = 31.0) -> HangFinding:
    behind = (1,) if kind == "behind" else ()
    return HangFinding("0", kind, seq, behind, (0, 2), age, 10.0)


@pytest.mark.unit
def test_due_after_abort_after_and_twice_the_threshold_within_half_the_timeout():
    policy = action.ActionPolicy()
    assert policy.due_s(10.0, 1800.0) == 20.0  # the default: abort_after, complete evidence
    assert policy.due_s(10.0, 1800.0, sure=False) == 30.0  # incomplete: 1.5x as long
    assert policy.due_s(25.0, 1800.0) == 50.0  # slow collectives: twice the hang threshold
    assert policy.due_s(60.0, 1800.0) == 120.0  # a symmetric hang's own, later threshold
    assert policy.due_s(10.0, 30.0) == 15.0  # never after half the process group's timeout
    assert policy.due_s(10.0, None) == 20.0
    assert action.ActionPolicy(after_s=45.0).due_s(10.0, None, sure=False) == 67.5


def _summary(rank: int, phase: str = "collective", inflight: bool = True, where=None) -> dict:
    frames = [{"file": "/job/train.py", "line": 10, "function": "main"}]
    if where:
        frames.append({"file": "/job/train.py", "line": where, "function": "load_batch"})
    return {
        "rank": rank,
        "phase": phase,
        "frames": frames,
        "where": frames[-1],
        "inflight": [{"op": "allreduce", "seq": 36, "pg": "0"}] if inflight else [],
    }


def _episode(**change) -> tuple[Episode, object]:
    from exporter.hangs import verdict

    summaries = {"0": _summary(0), "1": _summary(1, "compute", False, 42), "2": _summary(2)}
    summaries.update(change.pop("summaries", {}))
    episode = {
        "episode": 1,
        "pg": "0",
        "kind": "behind",
        "seq": 36.0,
        "threshold": 10.0,
        "behind": [1],
        "waiting": [0],
        "missing": [],
        "world_size": 3,
        "run": "r",
        "summaries": summaries,
        **change,
    }
    typed = codec.episode_from_dict(episode)
    answered = {int(r): s and codec.from_dict(Summary, s) for r, s in summaries.items()}
    return typed, verdict.verdict(typed, answered)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("change", "sure"),
    [
        ({}, True),  # rank 1 located in user code, 0 and 2 inside collective #36
        ({"kind": "symmetric", "behind": []}, False),  # nobody to blame
        ({"missing": [2], "summaries": {"2": None}}, False),  # a rank did not answer
        (
            {"summaries": {"1": _summary(1, "collective", True, 42)}},
            False,
        ),  # culprit in a collective
        ({"summaries": {"2": _summary(2, inflight=False)}}, False),  # 2 not seen waiting
        (
            {"summaries": {"2": _summary(2, inflight=False)}, "waiting": [0, 2]},
            True,
        ),  # trigger saw it
    ],
    ids=["complete", "symmetric", "unanswered", "culprit-in-collective", "not-waiting", "waiting"],
)
def test_certain_only_with_complete_evidence(change, sure):
    episode, found = _episode(**change)
    assert action.certain(episode, found) is sure


@pytest.mark.unit
@pytest.mark.parametrize(
    ("finding", "age", "steps", "acts"),
    [
        (_finding(), 31.0, STEPS, True),
        (_finding(), 29.0, STEPS, False),  # not yet (incomplete evidence: 30 s)
        (_finding(seq=37.0), 31.0, STEPS, False),  # the collective completed: progress
        (None, 31.0, STEPS, False),  # nothing stalled any more
        (_finding("section"), 31.0, STEPS, False),  # the culprit entered a declared section
        (_finding("waiting"), 31.0, STEPS, False),  # nobody behind, not symmetric yet
        (_finding(), 31.0, {0: 30, 1: 0, 2: 30}, False),  # a rank never completed a step
        (_finding(), 31.0, {}, False),
    ],
    ids=["due", "early", "progressed", "resolved", "section", "waiting", "slow-start", "empty"],
)
def test_due_only_for_a_hang_that_still_holds(finding, age, steps, acts):
    policy = action.ActionPolicy()
    got = action.due(policy, REQUEST, finding, reported_age=age, steps=steps, timeout=1800.0)
    assert got is acts
    # Complete evidence acts 10 s sooner, never on anything else.
    sure = action.due(
        policy, REQUEST, finding, reported_age=age - 10, steps=steps, timeout=1800.0, sure=True
    )
    assert sure is acts


@pytest.mark.unit
def test_a_symmetric_hang_acts_on_its_own_threshold():
    policy = action.ActionPolicy()
    symmetric = {"kind": "symmetric", "threshold": 60.0, "behind": ()}
    request = replace(REQUEST, **symmetric)
    finding = _finding("symmetric", age=100.0)
    assert not action.due(policy, request, finding, reported_age=100.0, steps=STEPS, timeout=None)
    assert action.due(policy, request, finding, reported_age=121.0, steps=STEPS, timeout=None)
    line = action.describe(
        action.decide(policy, _opened(**symmetric), [], "/d/r-hang-1", 121.0, None)
    )
    assert "every rank is stuck inside collective #36 (pg 0)" in line, line


@pytest.mark.unit
def test_the_line_names_culprit_place_folder_and_code():
    located = [Located(1, "", 0, "", "/job/train.py", 42, "load_batch")]
    plan = action.decide(
        action.ActionPolicy(exit_code=76), _opened(), located, "/d/r-hang-1", 31.4, 1800.0
    )
    assert codec.decode_action(codec.encode_action(plan)) == plan  # it travels as JSON
    line = action.describe(plan)
    assert line == (
        "ddp-exporter: aborting run r on hang episode 1: rank 1 never entered collective #36 "
        "(pg 0), stuck at train.py:42 in load_batch, for 31 s (abort after 30 s); dumps and "
        "verdict in /d/r-hang-1; every rank exits with code 76 so that the launcher restarts "
        "the job from its last checkpoint"
    )
    plan = action.decide(
        action.ActionPolicy(),
        _opened(),
        located,
        "/d/r-hang-1",
        21.0,
        1800.0,
        sure=True,
        nodes=["gpu-7"],
        decision="give_up",
        exit_code=69,
        streak=3,
        limit=3,
    )
    assert action.describe(plan) == (
        "ddp-exporter: aborting run r on hang episode 1: rank 1 (node gpu-7) never entered "
        "collective #36 (pg 0), stuck at train.py:42 in load_batch, for 21 s (abort after 20 s); "
        "dumps and verdict in /d/r-hang-1; every rank exits with code 69 and this is the last "
        "abort: 3 in a row without progress (limit 3), do not requeue; the hang action stops here"
    )
    plan = replace(plan, decision="decline", streak=4)
    assert action.describe(plan).startswith(
        "ddp-exporter: NOT aborting run r on hang episode 1: rank 1 (node gpu-7) never entered "
    ), plan
    assert "aborted 3 times in a row without progress (limit 3)" in action.describe(plan)


@pytest.mark.unit
def test_settings_resolve_keyword_environment_default_and_reject_bad_values():
    assert settings.on_hang("instrument", environ={}) == settings.OnHang("off", 20.0, 75, 3, 50, 69)
    env = {
        settings.ON_HANG: " Abort ",
        settings.ABORT_AFTER_S: "45",
        settings.ABORT_EXIT_CODE: "138",
        settings.ABORT_LIMIT: "5",
        settings.ABORT_PROGRESS_STEPS: "200",
        settings.GIVE_UP_EXIT_CODE: "78",
    }
    assert settings.on_hang("instrument", environ=env) == settings.OnHang(
        "abort", 45.0, 138, 5, 200, 78
    )
    assert settings.on_hang("instrument", "off", 5, environ=env).action == "off"  # keyword wins
    assert settings.on_hang("instrument", limit=0, environ=env).limit == 0  # never stop
    for kw, match in [
        ({"action": "kill"}, r"on_hang=\.\.\.\): expected 'off' or 'abort', got 'kill'"),
        ({"after_s": 0}, r"abort_after=\.\.\.\): expected seconds > 0, got 0"),
        ({"after_s": float("inf")}, "expected seconds > 0"),
        ({"after_s": "30"}, "expected seconds > 0, got '30'"),
        ({"limit": -1}, r"abort_limit=\.\.\.\): expected an int >= 0 \(0: never stop\), got -1"),
        ({"limit": True}, "abort_limit"),
    ]:
        with pytest.raises(ValueError, match=match):
            settings.on_hang("instrument", environ={}, **kw)
    for name, raw in [
        (settings.ON_HANG, "restart"),
        (settings.ABORT_AFTER_S, "-1"),
        (settings.ABORT_AFTER_S, "soon"),
        (settings.ABORT_EXIT_CODE, "0"),
        (settings.ABORT_EXIT_CODE, "256"),
        (settings.ABORT_LIMIT, "-2"),
        (settings.ABORT_LIMIT, "many"),
        (settings.ABORT_PROGRESS_STEPS, "0"),
        (settings.GIVE_UP_EXIT_CODE, "300"),
        (settings.GIVE_UP_EXIT_CODE, "75"),
    ]:
        # Logged, and the defaults used (exporter.settings): a variable never raises.
        assert settings.on_hang("instrument", environ={name: raw}) == settings.OnHang(), name


@pytest.mark.unit
def test_instrument_refuses_the_action_without_a_hang_watcher(ddp):
    model, _, opt = ddp
    with pytest.raises(ValueError, match="needs the hang watcher: a heartbeat"):
        exporter.instrument(model, optimizer=opt, port=0, heartbeat_s=0, on_hang="abort")
    with pytest.raises(ValueError, match=r"monitoring rank \(monitor_rank >= 0, got -1\)"):
        exporter.instrument(model, optimizer=opt, port=0, monitor_rank=-1, on_hang="abort")
    with pytest.raises(ValueError, match="expected 'off' or 'abort'"):
        exporter.instrument(model, optimizer=opt, port=0, on_hang=True)
    assert exporter.active() is None


@pytest.mark.unit
def test_the_action_from_the_environment_without_a_hang_watcher_is_logged_and_off(
    ddp, monkeypatch, caplog
):
    model, loader, opt = ddp
    monkeypatch.setattr(validate, "_logged", set())  # what earlier tests logged: forgotten
    monkeypatch.setattr(validate, "_invalid", {})
    monkeypatch.setenv(settings.ON_HANG, "abort")
    monkeypatch.setenv(settings.HEARTBEAT_S, "0")
    with caplog.at_level(logging.WARNING, logger="exporter"):
        obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1")
    lines = [r.getMessage() for r in caplog.records if settings.ON_HANG in r.getMessage()]
    assert len(lines) == 1 and "the hang action is off" in lines[0], lines
    assert "heartbeat_s > 0, got 0" in lines[0], lines
    assert obs.hangs is None and obs.heartbeat is None
    train_epoch(model, loader, opt)  # training goes on
    assert obs.recorder.snapshot().steps == len(loader)
    obs.close()


@pytest.mark.unit
def test_ranks_leave_together_the_monitoring_rank_last():
    """Three ranks as threads over one real store: each keeps and publishes, then all exit.

    The monitoring rank clears the attempt from the store after every rank is leaving and
    before it lets them go (no rank of the next attempt exists yet).
    """
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=10)
    server = TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
    keys = storekeys.for_run("leave-test")
    events: list[tuple[str, int, float]] = []
    policy = action.ActionPolicy(publish_s=1.0)
    plan = action.decide(policy, _opened(), [], "/d/r-hang-1", 31.0, None)

    def rank(r: int) -> None:
        store = TCPStore("127.0.0.1", server.port, None, False, timeout=timeout)
        leaving = action.Leaving(
            store,
            keys,
            r,
            monitor=r == 0,
            policy=policy,
            interval_s=0.2,
            errors=ErrorCounter(),
            publish=lambda: events.append(("published", r, time.monotonic())),
            exit=lambda code: events.append(("exit", r, time.monotonic(), code)),
            quiet=lambda: None,
            keep=lambda plan: events.append(("kept", r, time.monotonic(), plan.episode)),
            forget=lambda: events.append(
                ("forgot", r, time.monotonic(), server.check([keys.leave()]))
            ),
        )
        if r == 1:
            time.sleep(0.5)  # a rank that sees the action a watch later
        leaving.leave(plan, answered=[0, 1, 2])

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    published = {e[1]: e[2] for e in events if e[0] == "published"}
    exits = {e[1]: (e[2], e[3]) for e in events if e[0] == "exit"}
    assert sorted(exits) == [0, 1, 2] and {c for _, c in exits.values()} == {75}
    # Nobody left before the last rank had published; the monitoring rank set the signal.
    assert min(t for t, _ in exits.values()) >= max(published.values())
    assert server.check([keys.leave()])
    assert sorted(e[1] for e in events if e[0] == "kept") == [0, 1, 2]
    (forgot,) = [e for e in events if e[0] == "forgot"]
    # Only the monitoring rank, after every rank published, before the signal to leave.
    assert forgot[1] == 0 and forgot[2] >= max(published.values()) and forgot[3] is False


@pytest.mark.unit
def test_abort_communicators_is_a_no_op_without_nccl(ddp):
    model, _, _ = ddp
    started = time.monotonic()
    action.abort_communicators(timeout_s=5.0)
    assert time.monotonic() - started < 1.0
    # The gloo group is untouched: a collective still runs.
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 1.0


# -- whole jobs ------------------------------------------------------------------------------------
#: The collective the healthy ranks wait in when rank 1 never starts its step: DDP's gradient
#: allreduce, or FSDP2's all-gather of the first layer's weights in the forward.
WAITED_IN = {"ddp": "all_reduce", "fsdp2": "all_gather"}


@pytest.mark.stack
@pytest.mark.parametrize("parallel", list(WAITED_IN))
def test_a_hang_restarts_the_job_from_its_last_checkpoint(tmp_path, parallel):
    """The defaults (heartbeat 5 s, abort after 20 s) and the launch command people type.

    ``torchrun --standalone --max-restarts 1``: the agent's store is shared by both attempts;
    the abort clears the first attempt's keys so that the second connects. Rank 1 is stuck in
    user code at step 100. The same for a DDP and an FSDP2 job (each rank of the FSDP2 job
    checkpoints its own shards).
    """
    require("prometheus")
    run = "restart" if parallel == "ddp" else f"restart-{parallel}"
    go = tmp_path / "go"
    args = [
        str(tmp_path),
        "--stuck",
        "1:100",
        "--steps",
        "250",
        "--port",
        str(free_port(RANKS)),
        "--go",
        str(go),
        "--parallel",
        parallel,
    ]
    env = _env(tmp_path, run, DDP_EXPORTER_ON_HANG="abort")
    with Job(RANKS, args, env=env, module=WORKER, torchrun=_restarts()) as job:
        urls = job.wait_urls()
        prom_dir = tmp_path / "prom"
        with run_prometheus(prom_dir, fast_config(prom_dir, static_scrape(urls))) as prom:
            wait_for(lambda: len(prom.targets_up()) == RANKS, 60, "every rank scraped")
            go.touch()
            aborted = wait_for(
                lambda: [
                    a
                    for a in prom.api("alerts")["alerts"]
                    if a["labels"]["alertname"] == "DDPHangAborted"
                ],
                150,
                "DDPHangAborted",
            )
            assert job.wait(180) == 0, job.output()
            ever = prom.query(
                f'count by (alertname) (count_over_time(ALERTS{{run="{run}", '
                'alertstate="firing"}[10m]))'
            )
            pending = prom.query(f'ALERTS{{run="{run}", alertname="DDPJobKilled"}}')
    text = job.text()
    stuck = _line_of("# stuck here")
    where = f"restart_worker.py:{stuck} in wait_for_data"

    # Every rank of attempt 0 printed one line naming the culprit, where and the dump folder.
    lines = [line for line in text.splitlines() if ABORT_LINE in line]
    assert len(lines) == RANKS, text
    (folder,) = _episodes(tmp_path)
    for line in lines:
        assert f"rank 1 (node {HOST}) never entered collective" in line and where in line, line
        assert folder in line and "exits with code 75" in line, line
    assert "exitcode: 75" in text, text  # torchrun saw the documented code, then restarted
    assert "Traceback" not in text, text  # no rank's training thread unwound the abort

    # The restarted attempt resumed from a checkpoint taken before the hang and finished.
    resumed = {int(s) for s in re.findall(r"attempt 1 resumed at step (\d+)", text)}
    assert len(resumed) == 1 and 0 < resumed.pop() <= 100, text
    assert text.count("finished at step 250") == RANKS, text

    # The episode's dumps and verdict are on disk, and the verdict records the action.
    assert sorted(os.listdir(folder)) == [
        "episode.json",
        *(f"rank-{r}.{x}" for r in range(RANKS) for x in ("json", "txt")),
        "verdict.txt",
    ]
    with open(os.path.join(folder, "episode.json")) as f:
        action = json.load(f)["action"]
    assert (action["culprits"], action["exit_code"], action["kind"]) == ([1], 75, "behind")
    # Complete evidence (every rank answered, rank 1 located in user code, the others waiting):
    # the action acts at abort_after, 20 s, not the 30 s incomplete evidence waits.
    assert action["certain"] is True and action["age_s"] >= action["due_s"] == 20.0, action
    assert (action["decision"], action["streak"], action["nodes"]) == ("abort", 1, [HOST])
    with open(os.path.join(folder, "verdict.txt")) as f:
        verdict = f.read()
    assert "ACTION: aborted" in verdict, verdict
    assert f"rank 1 (node {HOST}) never entered {WAITED_IN[parallel]}" in verdict, verdict

    # The launcher's line and the run's ledger are next to the dumps.
    with open(os.path.join(tmp_path, "dumps", f"{run}-abort.txt")) as f:
        assert f.read() == (
            f"requeue=yes exit_code=75 attempt=0 aborts_without_progress=1 limit=3 "
            f"culprit_ranks=1 culprit_nodes={HOST} folder={folder}\n"
        )
    with open(os.path.join(tmp_path, "dumps", f"{run}-restarts.json")) as f:
        (entry,) = json.load(f)["attempts"]
    assert (entry["attempt"], entry["furthest"], entry["start_step"]) == (0, 100, 0), entry

    # Prometheus recorded the decision: one alert for the run, naming rank 1, its node and
    # file:line.
    (alert,) = aborted
    assert alert["labels"]["culprit_rank"] == "1", alert
    assert alert["labels"]["node"] == HOST, alert
    assert f"{stuck} in wait_for_data" in alert["annotations"]["description"], alert
    fired = {s["metric"]["alertname"] for s in ever}
    assert "DDPHangAborted" in fired and fired <= {"DDPHangAborted", "DDPCollectiveStalled"}, fired
    assert not pending


@pytest.mark.job
def test_one_process_per_rank_every_process_exits_the_monitoring_rank_stuck(tmp_path):
    """srun-style: rank 0 (the monitoring rank, hosting the store) is the culprit."""
    env = _env(
        tmp_path,
        "perrank",
        DDP_EXPORTER_ON_HANG="abort",
        DDP_EXPORTER_HEARTBEAT_S="1",
        DDP_EXPORTER_ABORT_AFTER_S="12",
        DDP_EXPORTER_ABORT_EXIT_CODE="76",
    )
    with Ranks(RANKS, [WORKER, str(tmp_path), "--stuck", "0:40"], env=env) as job:
        codes = job.wait(150)
        assert codes == {r: 76 for r in range(RANKS)}, job.output()
        for r in range(RANKS):
            out = job.out(r)
            assert out.count(ABORT_LINE) == 1, out
            assert f"rank 0 (node {HOST}) never entered collective" in out and "code 76" in out, out
    (folder,) = _episodes(tmp_path)
    with open(os.path.join(folder, "episode.json")) as f:
        action = json.load(f)["action"]
    # abort_after 12 s, but at least twice the 10 s threshold that declared the hang.
    assert (action["culprits"], action["exit_code"], action["due_s"]) == ([0], 76, 20.0)


EDGES = {
    # Nobody has completed a step: a rank still building its model (the others wait in the
    # broadcast of its weights), then a slow start.
    "start": ["--steps", "60", "--slow-build", "1:22", "--slow-start", "2:22"],
    # A straggler late enough for a hang dump that then progresses; a declared checkpoint and a
    # declared evaluation on rank 0 (the others wait for it, excused), after which rank 0 works
    # 6 s more before its next collective: the others' wait counts from the section's end.
    "sections": [
        "--steps",
        "200",
        "--straggle",
        "1:60:15",
        "--checkpoint-at",
        "120:22",
        "--eval-at",
        "160:22:6",
    ],
}
# The same edges in an FSDP2 job: rank 0's long checkpoint writes its shards, the others
# wait for it in the next all-gather.
EDGES["sections-fsdp2"] = [*EDGES["sections"], "--parallel", "fsdp2"]


@pytest.mark.job
def test_healthy_edges_never_abort(tmp_path):
    """Each edge lasts past the 20 s the action waits with complete evidence; the jobs finish.

    Three jobs at once (they idle through their edges): one per kind of edge, and the
    sections again under FSDP2.
    """
    jobs = {}
    try:
        for name, extra in EDGES.items():
            env = _env(
                tmp_path / name, name, DDP_EXPORTER_ON_HANG="abort", DDP_EXPORTER_HEARTBEAT_S="1"
            )
            (tmp_path / name).mkdir()
            args = [str(tmp_path / name), *extra]
            jobs[name] = Job(RANKS, args, env=env, module=WORKER, torchrun=_restarts())
        codes = {name: job.wait(300) for name, job in jobs.items()}
    finally:
        for job in jobs.values():
            job.stop()
    behind = {}
    for name, job in jobs.items():
        text = job.text()
        assert codes[name] == 0, text
        assert ABORT_LINE not in text and "attempt 1" not in text, text
        steps = 60 if name == "start" else 200
        assert text.count(f"finished at step {steps}") == RANKS, text
        # Each edge of a hang opened an episode (the action was armed and judged it); the
        # declared sections opened none. No verdict records an action, no ledger was written.
        behind[name] = []
        for folder in _episodes(tmp_path / name):
            with open(os.path.join(folder, "episode.json")) as f:
                episode = json.load(f)
            assert "action" not in episode, episode
            behind[name].append(episode["behind"])
        assert not glob.glob(str(tmp_path / name / "dumps" / "*-restarts.json"))
    for name in ("sections", "sections-fsdp2"):
        assert "rank 0: long checkpoint at step 120" in jobs[name].text()
        assert "rank 0: long evaluation at step 160" in jobs[name].text()
    # Rank 0 sends the weights it broadcasts and may run ahead of rank 2 while rank 1 builds.
    start = behind["start"]
    assert len(start) == 2 and 1 in start[0] and start[1] == [2], behind
    assert behind["sections"] == behind["sections-fsdp2"] == [[1]], behind


@pytest.mark.job
def test_action_off_a_hang_dumps_and_nobody_exits(tmp_path):
    env = _env(tmp_path, "off", DDP_EXPORTER_HEARTBEAT_S="1", DDP_EXPORTER_ABORT_AFTER_S="12")
    with Ranks(RANKS, [WORKER, str(tmp_path), "--stuck", "1:40"], env=env) as job:
        folder = wait_for(
            lambda: glob.glob(str(tmp_path / "dumps" / "*-hang-*" / "verdict.txt")),
            90,
            "the hang verdict",
        )
        urls = job.urls
        # Past the time the action would have taken (20 s from onset, the verdict came at ~12 s):
        # every rank still runs and publishes no abort.
        until = time.monotonic() + 20
        while time.monotonic() < until:
            assert all(p.poll() is None for p in job.procs.values()), job.output()
            time.sleep(1.0)
        for r in range(RANKS):
            assert "ddp_hang_abort_timestamp_seconds" not in parse(scrape_text(urls[r]))
        assert ABORT_LINE not in job.output()
        with open(folder[0]) as f:
            assert "ACTION" not in f.read()
