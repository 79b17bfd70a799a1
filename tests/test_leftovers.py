"""The session-wide check: a test that leaves a process running fails the run, naming it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import leftovers
import pytest
from harness import REPO, wait_for

from exporter.tools.reaper import Proc

pytestmark = pytest.mark.tool

TESTS = os.path.join(REPO, "tests")


def _inner_env() -> dict[str, str]:
    """The environment of the inner session: this session's own options are not its own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return dict(env, PYTHONPATH=REPO, DDP_EXPORTER_TEST_LEFTOVER_GRACE="1")


def _conftest(folder: Path) -> None:
    """Give the inner session the suite's own leftover check, as tests/conftest.py does."""
    (folder / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {TESTS!r})\n"
        "from leftovers import (  # noqa: F401\n"
        "    pytest_configure, pytest_configure_node, pytest_runtest_setup,\n"
        "    pytest_sessionfinish, unwind_on_signals,\n"
        ")\n"
        "unwind_on_signals()\n"
    )


def _run_inner(folder: Path, **env: str) -> tuple[int, str]:
    """Run the inner session of ``folder`` in one process; return its status and output."""
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
        env=dict(_inner_env(), **env),
    )
    return res.returncode, res.stdout + res.stderr


def test_a_leaked_process_fails_the_session_and_is_named(tmp_path):
    _conftest(tmp_path)
    (tmp_path / "test_leak.py").write_text(
        textwrap.dedent(
            """
            import subprocess, sys

            def test_leaks():
                p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                     start_new_session=True)
                print("LEAKED", p.pid)

            def test_clean():
                subprocess.run([sys.executable, "-c", "pass"], check=True)
            """
        )
    )
    code, out = _run_inner(tmp_path)
    leaked = int(out.split("LEAKED ")[1].split()[0])
    assert code == 1, out
    assert "1 process(es) started by the tests were still running" in out, out
    assert f"pid {leaked} from test_leak.py::test_leaks" in out, out
    assert "test_clean" not in out.split("still running")[1], out
    assert Proc.of(leaked) is None  # and it was killed


def test_a_process_started_while_the_session_ends_is_found_and_killed(tmp_path):
    """A launcher torn down as the session ends may start a process meanwhile (torchrun
    restarting a worker that was killed): the check looks anew until nothing is left. Here the
    leaked launcher starts its worker, in a session of its own, a second into the grace and
    then exits: the first look sees only the launcher."""
    _conftest(tmp_path)
    (tmp_path / "test_respawn.py").write_text(
        textwrap.dedent(
            """
            import subprocess, sys

            LAUNCHER = (
                "import subprocess, sys, time; time.sleep(0.5); "
                "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
                "start_new_session=True); print('WORKER', p.pid, flush=True)"
            )

            def test_leaks_a_launcher():
                subprocess.Popen([sys.executable, "-c", LAUNCHER], start_new_session=True)
            """
        )
    )
    code, out = _run_inner(tmp_path, DDP_EXPORTER_TEST_LEFTOVER_GRACE="3")
    worker = int(out.split("WORKER ")[1].split()[0])
    assert code == 1, out
    assert f"pid {worker} from test_respawn.py::test_leaks_a_launcher" in out, out
    assert Proc.of(worker) is None  # and it was killed


def test_a_worker_started_while_a_look_runs_is_found(monkeypatch):
    """The launcher starts its worker and exits in the middle of a look: when the look reads
    the launcher it is gone, and the worker is newer than the look's listing of /proc."""
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; sys.stdin.readline(); p = subprocess.Popen([sys.executable,"
            " '-c', 'import time; time.sleep(120)'], start_new_session=True,"
            " stdout=subprocess.DEVNULL); print(p.pid)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    real, worker = leftovers._environ, []

    def reading(pid: int) -> dict[str, str]:
        if pid == launcher.pid and not worker:
            out, _ = launcher.communicate("go\n", timeout=60)  # it starts the worker, exits
            worker.append(int(out))
        return real(pid)

    monkeypatch.setattr(leftovers, "_environ", reading)
    try:
        left = leftovers.wait_gone(timeout=0)
    finally:
        launcher.kill()
        launcher.wait()
        if worker and Proc.of(worker[0]) is not None:
            os.kill(worker[0], signal.SIGKILL)
    assert worker and [x.proc.pid for x in left] == worker, (worker, left)


def test_a_parallel_session_ended_by_sigterm_reaps_what_its_workers_started(tmp_path):
    """SIGTERM to xdist's controller (a CI timeout) ends a worker whose clean-up takes too long
    by SIGKILL: the controller's end still finds the job that worker's test started, names it
    and kills it."""
    _conftest(tmp_path)
    started = tmp_path / "started"
    (tmp_path / "test_long.py").write_text(
        textwrap.dedent(
            f"""
            import os, subprocess, sys, time

            def test_long_job():
                p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                     start_new_session=True)
                with open({str(started)!r} + ".tmp", "w") as f:
                    f.write(str(p.pid))
                os.replace({str(started)!r} + ".tmp", {str(started)!r})
                try:
                    time.sleep(600)
                finally:
                    time.sleep(600)  # a teardown too slow for xdist, which kills the worker

            def test_quick():
                pass
            """
        )
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", str(tmp_path)]
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=_inner_env(),
    ) as inner:
        try:
            wait_for(started.exists, 120, "the inner test to start its job")
            job = Proc.of(int(started.read_text()))
            assert job is not None
            inner.send_signal(signal.SIGTERM)
            out, _ = inner.communicate(timeout=120)
        finally:
            if inner.poll() is None:
                inner.kill()
    assert "1 process(es) started by the tests were still running" in out, out
    assert f"pid {job.pid} from test_long.py::test_long_job" in out, out
    assert not job.alive(), out
