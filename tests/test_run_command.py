"""``ddp-exporter run`` on unmodified training scripts, under torchrun and one process per rank.

The scripts (tests/workers/unmodified_worker.py) import nothing of the exporter. Every rank
must serve its series, count the script's own steps, and a rank made slow must be named by
compute; a script that also calls ``instrument()`` is instrumented once; with Prometheus and
Alertmanager installed, ``run`` prints the straggler's alert itself and leaves nothing running
when it is stopped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import (
    REPO,
    Process,
    Ranks,
    child_env,
    free_port,
    parse,
    scrape_text,
    top_accuses,
    value,
    wait_for,
)

from exporter.tools.reaper import Proc, descendants

WORKER = os.path.join(REPO, "tests", "workers", "unmodified_worker.py")
RUN = [sys.executable, "-m", "exporter.tools.cli", "run"]
ENV = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_PORT": "0", "DDP_EXPORTER_ADDR": "127.0.0.1"}


def _torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
    ]


def _trained(text: str) -> dict[int, int]:
    return {int(r): int(n) for r, n in re.findall(r"^trained (\d+) (\d+)$", text, re.M)}


def _final_steps(
    output: Callable[[], str], urls: dict[int, str], ranks: int, hold: Path
) -> dict[int, float]:
    """Scrape each rank until a scrape begun after it printed its count: its final count.

    The ranks run with ``--hold``: they serve until ``hold`` exists, made once every final
    count is read (a busy machine can starve this test past any clean end's wait).
    """
    counted: dict[int, float] = {}

    def final() -> dict[int, float] | None:
        finished = _trained(output())
        for r in range(ranks):
            if r not in counted:
                text = scrape_text(urls[r])
                if r in finished:
                    counted[r] = value(parse(text), "ddp_steps_total")
        return counted if len(counted) == ranks else None

    try:
        return wait_for(final, 240, "every rank's final count", interval=0.5)
    finally:
        hold.touch()


@pytest.mark.job
@pytest.mark.parametrize(
    ("shape", "parallelism", "cause"),
    [
        ("ddp", "ddp", "compute"),
        ("fsdp2", "fsdp2", "compute"),
        ("accelerate", "ddp", "compute"),
        ("trainer", "ddp", "data"),
    ],
)
def test_an_unmodified_script_has_every_rank_watched_and_its_straggler_named(
    shape, parallelism, cause
):
    script = [WORKER, "--shape", shape, "--steps", "0", "--slow-rank", "2", "--slow-s", "0.06"]
    with Process([*RUN, "--no-stack", "--", *_torchrun(3), *script], child_env(ENV)) as job:
        urls = wait_for(lambda: job.urls if len(job.urls) == 3 else None, 180, "3 rank URLs")
        for r in range(3):
            info = parse(scrape_text(urls[r]))["ddp_rank_info"]
            assert info and info[0][0]["parallelism"] == parallelism, info
        targets = [urls[r] for r in range(3)]
        accused = wait_for(
            top_accuses(targets, 2, f"straggler: {cause}"), 120, "top to name rank 2", interval=3
        )
        assert list(accused) == [2]
        assert "never called optimizer.step()" not in job.text()


def _accelerate_launch(nproc: int) -> list[str]:
    """``accelerate launch`` of ``nproc`` processes (on a CPU it starts them through torchrun)."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is not installed (extra transformers)")
    flags = ["--multi_gpu", "--num_processes", str(nproc), "--num_machines", "1"]
    flags += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    flags += ["--main_process_port", str(free_port())]
    return [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", *flags]


@pytest.mark.job
@pytest.mark.parametrize(
    "launch",
    ["fsdp2-torchrun", "loop-torchrun", "ddp-per-rank", "ddp-instrumented", "accelerate-launch"],
)
def test_every_step_of_an_unmodified_script_is_counted_once(launch, tmp_path):
    steps = 40
    shape = launch.split("-")[0]
    hold = tmp_path / "read"
    script = [WORKER, "--shape", shape, "--steps", str(steps), "--hold", str(hold)]
    launcher = _accelerate_launch(2) if launch == "accelerate-launch" else _torchrun(2)
    if launch == "ddp-instrumented":
        script.append("--instrument")
    if launch == "ddp-per-rank":
        # As srun starts it: one `ddp-exporter run` per rank, each around one python.
        with Ranks(2, [*RUN[1:], "--no-stack", "--", sys.executable, *script], env=ENV) as job:
            urls = wait_for(lambda: job.urls if len(job.urls) == 2 else None, 180, "URLs")
            counted = _final_steps(job.output, urls, 2, hold)
            assert job.wait(120) == {0: 0, 1: 0}, job.output()
            text = job.output()
    else:
        with Process([*RUN, "--no-stack", "--", *launcher, *script], child_env(ENV)) as job:
            urls = wait_for(lambda: job.urls if len(job.urls) == 2 else None, 180, "URLs")
            counted = _final_steps(job.text, urls, 2, hold)
            assert job.wait(120) == 0, job.output()
            text = job.text()
    assert counted == {0: steps, 1: steps}, text
    assert _trained(text) == {0: steps, 1: steps}
    instrumented_by_run = text.count("instrumented at its first optimizer step")
    assert instrumented_by_run == (0 if launch == "ddp-instrumented" else 2), text
    assert text.count("metrics at http") == 2, text  # one endpoint per rank
    assert "called twice" not in text and "not armed" not in text, text


@pytest.mark.job
def test_a_ctrl_c_stops_the_command_its_own_way_and_leaves_nothing():
    cmd = [*RUN, "--no-stack", "--", *_torchrun(2), WORKER, "--steps", "0"]
    with Process(cmd, child_env(ENV)) as job:
        wait_for(lambda: len(job.urls) == 2, 180, "both ranks' URLs")
        started = descendants(job.pid)
        # Sent to run alone (no terminal): run passes it on and waits for torchrun to stop.
        job.send_signal(signal.SIGINT)
        assert job.wait(90) == 128 + signal.SIGINT, job.output()
        assert "waiting up to" in job.text()
        left = [p for p in started if p.alive()]
        assert not left, left


def _grafana_standin(folder) -> str:
    """An executable named grafana running the stand-in (Grafana cannot be installed here)."""
    path = folder / "grafana"
    standin = os.path.join(REPO, "tests", "workers", "grafana_standin.py")
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {standin} "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.stack
def test_run_prints_the_straggler_alert_from_its_own_stack_and_leaves_nothing(tmp_path):
    report = tmp_path / "grafana.json"
    grafana = {
        "DDP_EXPORTER_GRAFANA_BINARY": _grafana_standin(tmp_path),
        "GRAFANA_STANDIN_REPORT": str(report),
    }
    env = child_env(dict(ENV, TMPDIR=str(tmp_path), **grafana))
    script = [WORKER, "--steps", "0", "--slow-rank", "1", "--slow-s", "0.06"]
    cmd = [*RUN, "--stack", "--fast", "--top", "3", "--", *_torchrun(3), *script]
    with Process(cmd, env) as job:
        wait_for(
            lambda: job.seen("ALERT DDPRankStraggler") is not None or job.poll() is not None,
            240,
            "run to print the straggler's alert",
        )
        lines = [line for line in job.lines if "ALERT DDPRankStraggler" in line]
        assert lines and all("rank=1 " in line for line in lines), job.output()
        assert "FAST rules" in job.text()
        # Grafana (a stand-in) provisioned with the live Prometheus and every dashboard.
        assert re.search(r"dashboards at http://127\.0\.0\.1:\d+/d/ddp-overview", job.text())
        found = json.loads(report.read_text())
        assert found["prometheus_ready"] == 200 and found["addr"] == "127.0.0.1", found
        assert found["datasource_uid"] == "ddp-prometheus" and found["anonymous"] == "true"
        assert "ddp-overview" in found["dashboards"] and len(found["dashboards"]) == 7, found
        # The table too, naming the same rank (by compute) and nobody else.
        wait_for(lambda: re.search(r"^ +1 .*straggler: compute", job.text(), re.M), 60, "top")
        tables = re.findall(r"^ +(\d) .*(?:straggler|HUNG|DOWN)", job.text(), re.M)
        assert set(tables) == {"1"}, job.output()
        started = descendants(job.pid)
        names = {p.pid for p in started}
        assert len(names) >= 5, started  # Prometheus, Alertmanager, torchrun and its ranks
        job.send_signal(signal.SIGTERM)
        assert job.wait(60) == 128 + signal.SIGTERM, job.output()
        left = [p for p in started if Proc.of(p.pid) is not None and p.alive()]
        assert not left, left
        assert Proc.of(found["pid"]) is None, "Grafana is left running"
        assert not list(tmp_path.glob("ddp-exporter-run-*")), "its working folder is left"


@pytest.mark.tool
def test_run_says_in_one_line_what_it_cannot_do_and_passes_the_exit_status_on(tmp_path):
    # A PATH with python but without Prometheus: the stack cannot be had.
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = child_env({"PATH": str(bare)})

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*RUN, *args], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )

    out = run()
    assert out.returncode == 2 and "a command to run is needed" in out.stderr
    out = run("--port", "abc", "--", "python3", "-c", "pass")
    assert out.returncode == 2 and "--port: expected an int" in out.stderr, out.stderr
    out = run("--no-stack", "--", "python3", "-c", "import sys; sys.exit(3)")
    assert (out.returncode, out.stderr) == (3, "")
    out = run("--no-stack", "--", "no-such-command")
    assert out.returncode == 127 and "cannot run no-such-command" in out.stderr
    out = run("--stack", "--", "python3", "-c", "pass")
    assert out.returncode == 2 and "--stack:" in out.stderr and "prometheus" in out.stderr
    out = run("--", "python3", "-c", "print('trained')")
    assert out.returncode == 0 and out.stdout == "trained\n", out
    assert out.stderr.count("\n") == 1 and "no alerts on this host" in out.stderr, out.stderr
    # Ranks served over TLS: run's own Prometheus and table would see every rank down.
    env["DDP_EXPORTER_WEB_CONFIG"] = str(tmp_path / "web.yml")
    for flag in ("--stack", "--top=5"):
        out = run(flag, "--", "python3", "-c", "print('trained')")
        assert out.returncode == 2 and out.stdout == "", out
        assert f"{flag.split('=')[0]}: the ranks serve as DDP_EXPORTER_WEB_CONFIG" in out.stderr
    out = run("--", "python3", "-c", "print('trained')")
    assert out.returncode == 0 and out.stdout == "trained\n", out
    assert out.stderr.count("\n") == 1 and "(TLS, passwords)" in out.stderr, out.stderr


_NO_STEP = """
import torch, torch.distributed as dist
dist.init_process_group("gloo", world_size=1, rank=0)
for batch in torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4):
    torch.nn.Linear(2, 1)(batch)
dist.destroy_process_group()
"""

_ONE_PROCESS = """
import torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 2)).sum().backward()
opt.step()
print("stepped")
"""


@pytest.mark.job
def test_what_run_cannot_find_is_said_in_one_line_and_the_script_runs_on():
    rank = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    env = child_env(dict(ENV, MASTER_PORT=str(free_port()), **rank))
    cmd = [*RUN, "--no-stack", "--", sys.executable, "-c"]
    out = subprocess.run([*cmd, _NO_STEP], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if line.startswith("ddp-exporter run:")]
    assert len(said) == 1 and "rank 0 never called optimizer.step()" in said[0], out.stderr
    one = subprocess.run(
        [*cmd, _ONE_PROCESS], env=child_env(ENV), capture_output=True, text=True, timeout=120
    )
    assert one.returncode == 0 and one.stdout == "stepped\n", one
    said = [line for line in one.stderr.splitlines() if line.startswith("ddp-exporter run:")]
    assert len(said) == 1 and "a one-process job, nothing to watch" in said[0], one.stderr


_EVAL_THEN_DESTROY = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
out = torch.nn.Linear(2, 1)(torch.randn(4, 2)).detach()
dist.all_reduce(out)
dist.destroy_process_group()
"""


@pytest.mark.job
def test_a_rank_that_never_steps_says_so_after_it_destroys_its_group(tmp_path):
    # No DataLoader and no group left at exit: only the group it destroyed makes it a rank.
    script = tmp_path / "tiny_eval.py"
    script.write_text(_EVAL_THEN_DESTROY)
    cmd = [*RUN, "--no-stack", "--", *_torchrun(2), str(script)]
    out = subprocess.run(cmd, env=child_env(ENV), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    said = sorted(line for line in out.stderr.splitlines() if "never called" in line)
    assert len(said) == 2, out.stderr
    for rank, line in enumerate(said):
        assert line.startswith(f"ddp-exporter run: rank {rank} never called optimizer.step()")
