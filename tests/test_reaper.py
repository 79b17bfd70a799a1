"""stop_tree: a launcher whose workers live in their own sessions leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from harness import wait_for

from exporter.tools.reaper import Proc, descendants, stop_tree

pytestmark = pytest.mark.tool

# A launcher like torchrun: it starts workers in sessions of their own and, on SIGTERM,
# exits without stopping them. One worker ignores SIGTERM, one is stopped (SIGSTOP).
LAUNCHER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    deaf = [sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(600)"]
    a = subprocess.Popen(sleeper, start_new_session=True)
    b = subprocess.Popen(deaf, start_new_session=True, stdout=subprocess.PIPE, text=True)
    b.stdout.readline()
    c = subprocess.Popen(sleeper, start_new_session=True)
    c.send_signal(signal.SIGSTOP)
    print(a.pid, b.pid, c.pid, flush=True)
    time.sleep(600)
    """
)


def test_stop_tree_ends_workers_in_their_own_sessions():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in launcher.stdout.readline().split()]
        workers = [Proc.of(pid) for pid in pids]
        assert all(workers), pids
        assert {p.pid for p in descendants(launcher.pid)} >= set(pids)
        wait_for(
            lambda: open(f"/proc/{pids[2]}/stat").read().split(") ")[1][0] == "T",
            10,
            "the third worker to be stopped",
        )
        t0 = time.monotonic()
        killed = stop_tree(launcher, grace=3.0)
        took = time.monotonic() - t0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == -signal.SIGTERM  # the launcher was asked first
    assert not any(p.alive() for p in workers), [p for p in workers if p.alive()]
    # The launcher left its workers running: they got a SIGTERM of their own; the one that
    # ignores it was killed by pid.
    assert {p.pid for p in killed} == {pids[1]}
    assert took < 3.0 + 5.0, took


def test_stop_tree_is_quick_when_the_launcher_stops_its_own_workers():
    code = (
        "import subprocess, sys, time; "
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "print(w.pid, flush=True); time.sleep(600)"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    worker = Proc.of(int(launcher.stdout.readline()))
    assert worker is not None
    # The launcher dies on SIGTERM and leaves its worker: the worker is stopped right after,
    # without waiting out the launcher's grace period.
    t0 = time.monotonic()
    stop_tree(launcher, grace=30.0)
    assert not worker.alive()
    assert time.monotonic() - t0 < 10.0
