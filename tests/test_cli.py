"""The ddp-exporter command: usage errors, taken ports, and the demo's live table."""

import socket
import subprocess
import sys

from harness import REPO

import exporter.top as top


def run_cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_unknown_fault_is_a_usage_error():
    res = run_cli("demo", "--fault", "meteor")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_fault_rank_out_of_range_is_a_usage_error():
    res = run_cli("demo", "--ranks", "2", "--fault", "hang", "--fault-rank", "5")
    assert res.returncode == 2 and "--fault-rank 5 is out of range" in res.stderr


def test_taken_port_names_the_port_and_the_way_out():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_cli("demo", "--ranks", "2", "--port", str(port - 1))
    assert res.returncode == 2
    assert str(port) in res.stderr and "--port" in res.stderr


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


def test_diagnose_names_a_rank_that_is_behind_in_a_hang():
    rows = [top.RankRow(f"t{i}", rank=i, up=True, enqueued=10, inflight_age=5.0) for i in range(3)]
    rows[1].enqueued, rows[1].inflight_age = 9, 0.0
    rows.append(top.RankRow("t3", rank=3, up=False))
    out = {r.rank: r.verdict for r in top.diagnose(rows)}
    assert out[1].startswith("HUNG") and out[3].startswith("DOWN")
    assert out[0] == "" and out[2] == ""
    table = top.render(rows, worst=2)
    assert table.splitlines()[1].split()[0] == "3" and "2 more ranks" in table


def test_stack_without_binaries_says_how_to_install():
    import os

    env = dict(os.environ, PATH=os.path.dirname(sys.executable))
    res = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "demo", "--stack"], capture_output=True,
        text=True, timeout=60, cwd=REPO, env=env,
    )  # fmt: skip
    assert res.returncode == 2
    assert "apt-get install prometheus prometheus-alertmanager" in res.stderr


def test_demo_with_stack_prints_the_alert_naming_the_killed_rank():
    import shutil

    import pytest

    if not shutil.which("prometheus"):
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    res = run_cli(
        "demo", "--stack", "--ranks", "3", "--fault", "kill", "--fault-rank", "2",
        "--fault-after", "4", "--duration", "35", "--port", "0", "--no-top",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Prometheus: http://127.0.0.1:" in res.stdout
    down = [line for line in res.stdout.splitlines() if line.startswith("ALERT DDPRankDown")]
    assert down and all("rank=2 " in line for line in down), res.stdout
