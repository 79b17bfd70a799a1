"""ddp-exporter top, reading a run from a real Prometheus that scrapes a real 2-rank job."""

import subprocess
import sys

import pytest
from harness import REPO, Job, wait_for

from exporter.localstack import LocalStack, MissingBinaryError, find_binaries


def test_top_from_prometheus_shows_every_rank(tmp_path):
    try:
        find_binaries()
    except MissingBinaryError as exc:
        pytest.skip(str(exc))
    sd = tmp_path / "sd"
    sd.mkdir()
    args = ["--duration", "60", "--port", "0", "--addr", "127.0.0.1", "--file-sd", str(sd)]
    with (
        LocalStack(tmp_path / "stack", sd) as st,
        Job(2, args, env={"DDP_EXPORTER_RUN": "toprun"}) as job,
    ):
        job.wait_urls()
        wait_for(lambda: len(st.query('ddp_steps_total{run="toprun"} > 5')) == 2, 60, "scrapes")
        res = subprocess.run(
            [sys.executable, "-m", "exporter.cli", "top", "--prometheus", st.prometheus_url,
             "--run", "toprun", "--once"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = res.stdout.splitlines()[1:]
    assert sorted(line.split()[0] for line in rows) == ["0", "1"], res.stdout
    assert all("DOWN" not in line for line in rows)


def test_top_needs_exactly_one_source():
    res = subprocess.run([sys.executable, "-m", "exporter.cli", "top"], capture_output=True,
                         text=True, timeout=60, cwd=REPO)  # fmt: skip
    assert res.returncode == 2 and "--prometheus" in res.stderr
    res = subprocess.run([sys.executable, "-m", "exporter.cli", "top", "--prometheus", "http://x"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)  # fmt: skip
    assert res.returncode == 2 and "--run" in res.stderr
