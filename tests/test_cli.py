"""The ddp-exporter command: usage errors, taken ports, the demo's live table, and a demo
stopped by a signal at any time leaving no process behind."""

import signal
import socket
import subprocess
import sys

import leftovers
import pytest
from harness import REPO, Process, child_env, free_port, wait_for

from exporter.tools.localstack import MissingBinaryError, find_binaries


def run_cli(*args, timeout=120, module="exporter.tools.cli"):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


@pytest.mark.tool
def test_unknown_fault_is_a_usage_error():
    res = run_cli("demo", "--fault", "meteor")
    assert res.returncode == 2 and "invalid choice" in res.stderr


@pytest.mark.tool
def test_fault_rank_out_of_range_is_a_usage_error():
    res = run_cli("demo", "--ranks", "2", "--fault", "hang", "--fault-rank", "5")
    assert res.returncode == 2 and "--fault-rank 5 is out of range" in res.stderr


@pytest.mark.tool
def test_a_gpu_stall_without_a_gpu_is_a_usage_error():
    """The trainer's stall fault needs a CUDA stream to stall: refused before any process group."""
    res = run_cli("--fault", "stall", "--port", "0", module="exporter.tools.trainer")
    assert res.returncode == 2 and "--fault stall needs --device cuda" in res.stderr, res.stderr


@pytest.mark.tool
def test_taken_port_names_the_port_and_the_way_out():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_cli("demo", "--ranks", "2", "--port", str(port - 1))
    assert res.returncode == 2
    assert str(port) in res.stderr and "--port" in res.stderr


@pytest.mark.job
def test_demo_runs_and_the_table_names_the_straggler():
    res = run_cli(
        "demo",
        "--ranks",
        "3",
        "--fault",
        "straggler",
        "--fault-rank",
        "2",
        "--fault-after",
        "0",
        "--duration",
        "12",
        "--port",
        "0",
        "--refresh",
        "3",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for r in range(3):
        assert f"rank {r}: metrics at http://127.0.0.1:" in res.stdout
    verdicts = [line for line in res.stdout.splitlines() if "straggler: compute" in line]
    assert verdicts and all(line.split()[0] == "2" for line in verdicts), res.stdout
    # After the normal end the last table says every rank finished, not that it is down (a
    # rank whose endpoint closed before the table's read of its end ended with its peers).
    last = res.stdout.split(" rank  step ms")[-1].splitlines()[1:4]
    assert all("finished: ended" in line for line in last), res.stdout[-2000:]
    assert "DOWN" not in res.stdout.split(" rank  step ms")[-1], res.stdout[-2000:]


@pytest.mark.job
def test_demo_runs_twice_in_a_row_on_the_same_ports():
    base = free_port(2)  # the demo's two ranks serve on base and base + 1
    for _ in range(2):  # the first run's connections linger in TIME_WAIT: no refusal
        res = run_cli(
            "demo",
            "--ranks",
            "2",
            "--duration",
            "4",
            "--port",
            str(base),
            "--refresh",
            "1",
            "--no-stack",
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert "in use" not in res.stderr


@pytest.mark.tool
def test_stack_without_binaries_says_how_to_install():
    import os

    env = dict(os.environ, PATH=os.path.dirname(sys.executable))
    res = subprocess.run(
        [sys.executable, "-m", "exporter.tools.cli", "demo", "--stack", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert res.returncode == 2
    assert "apt-get install prometheus prometheus-alertmanager" in res.stderr


@pytest.mark.job
def test_demo_with_stack_prints_the_alert_naming_the_killed_rank():
    import shutil

    import pytest

    if not shutil.which("prometheus"):
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    res = run_cli(
        "demo",
        "--stack",
        "--ranks",
        "3",
        "--fault",
        "kill",
        "--fault-rank",
        "2",
        "--fault-after",
        "4",
        "--duration",
        "35",
        "--port",
        "0",
        "--no-top",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Prometheus: http://127.0.0.1:" in res.stdout
    down = [line for line in res.stdout.splitlines() if line.startswith("ALERT DDPRankDown")]
    assert down and all("rank=2 " in line for line in down), res.stdout


def _has_stack() -> bool:
    try:
        find_binaries()
    except MissingBinaryError:
        return False
    return True


@pytest.mark.job
@pytest.mark.parametrize(
    ("fault", "sig", "when", "stack"),
    [
        ("hang", signal.SIGINT, "injecting fault", False),
        ("hang", signal.SIGTERM, "injecting fault", True),
        ("freeze", signal.SIGINT, "injecting fault", True),
        ("freeze", signal.SIGTERM, "injecting fault", False),
        ("hang", signal.SIGTERM, "ranks on gloo", False),  # while torchrun starts its ranks
    ],
)
def test_interrupted_demo_leaves_no_process(request, fault, sig, when, stack):
    if stack and not _has_stack():
        pytest.skip("prometheus and prometheus-alertmanager not installed")
    cmd = [
        sys.executable,
        "-m",
        "exporter.tools.cli",
        "demo",
        "--ranks",
        "3",
        "--fault",
        fault,
        "--fault-rank",
        "1",
        "--fault-after",
        "2",
        "--duration",
        "0",
        "--port",
        "0",
        "--no-top",
        "--stack" if stack else "--no-stack",
    ]
    # Like a shell does for a foreground job: the demo leads its own process group, and SIGINT
    # has its default action even when this session inherited it ignored (a background shell).
    with Process(cmd, child_env()) as demo:
        wait_for(lambda: when in demo.text(), 180, f"the demo to print {when!r}")
        mine = [x for x in leftovers.leftovers() if x.test == request.node.nodeid]
        if when == "injecting fault":
            assert len(mine) >= 4, mine  # the CLI, torchrun and its ranks (+ the stack)
        demo.send_signal(sig)
        code = demo.wait(timeout=90)
    assert code == 128 + sig, demo.text()
    left = [x for x in leftovers.leftovers() if x.test == request.node.nodeid]
    assert not left, [(x.proc.pid, x.cmdline) for x in left]
    text = demo.text()
    assert "stopping every process it started" in text
    stop = text.index("stopping every process it started")
    assert "Traceback" not in text[stop:] and 'File "' not in text[stop:], text[stop:]


@pytest.mark.unit
def test_nodes_ranks_the_suspect_first_and_says_when_there_is_nothing():
    from exporter.tools.nodes import NodeRow, render_nodes

    assert "no node seen" in render_nodes([])
    rows = sorted(
        [
            NodeRow("busy", runs_seen=40),
            NodeRow("once", runs_seen=9, runs_blamed=1, recent_blamed=1, causes={"data": 1}),
            NodeRow(
                "bad",
                runs_seen=6,
                runs_blamed=4,
                recent_blamed=4,
                suspect=True,
                causes={"compute": 3, "hang": 1},
                evidence=[(1.7e9, "job-7", "hang"), (1.6e9, "job-3", "compute")],
            ),
        ],
        key=NodeRow.key,
    )
    lines = render_nodes(rows, worst=2).splitlines()
    assert lines[2].startswith("bad ") and lines[2].endswith("compute 3, hang 1  SUSPECT")
    assert "run job-7: hang" in lines[3] and "run job-3: compute" in lines[4]
    assert lines[5].startswith("once ") and lines[-1] == "... 1 more nodes (--worst)"
