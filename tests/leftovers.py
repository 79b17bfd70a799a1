"""Find processes the tests started that are still alive: nothing may outlive the test session.

Import :func:`pytest_runtest_setup` and :func:`pytest_sessionfinish` into a conftest to use it.
Every process a test starts inherits the environment variable :data:`MARK`, set to
``<pytest pid>/<test node id>`` before each test's set-up (torchrun passes it on to its
workers, Popen to Prometheus). At the end of the session any live process carrying this
session's mark is a leak, reported with the test that started it, then killed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import pytest

from exporter.tools.reaper import Proc

__all__ = [
    "MARK",
    "Leftover",
    "kill",
    "leftovers",
    "mark",
    "pytest_runtest_setup",
    "pytest_sessionfinish",
    "wait_gone",
]

MARK = "DDP_EXPORTER_TEST_PROCESS"
#: Seconds that processes still being torn down at the session's end get before they count.
GRACE = float(os.environ.get("DDP_EXPORTER_TEST_LEFTOVER_GRACE", "15"))


def mark(nodeid: str) -> None:
    """Tag the processes started from now on with this session and ``nodeid``."""
    os.environ[MARK] = f"{os.getpid()}/{nodeid}"


@dataclass(frozen=True)
class Leftover:
    """A live process started by a test of this session."""

    proc: Proc
    test: str
    cmdline: str


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, val = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = val.decode(errors="replace")
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def leftovers(session_pid: int | None = None) -> list[Leftover]:
    """Return the live processes (not zombies) that carry this session's mark."""
    session_pid = os.getpid() if session_pid is None else session_pid
    prefix = f"{session_pid}/"
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == session_pid:
            continue
        value = _environ(int(name)).get(MARK, "")
        proc = Proc.of(int(name))
        if value.startswith(prefix) and proc is not None:
            out.append(Leftover(proc, value[len(prefix) :], _cmdline(proc.pid)))
    return out


def wait_gone(timeout: float) -> list[Leftover]:
    """Give processes being torn down ``timeout`` seconds; return those still alive."""
    deadline = time.monotonic() + timeout
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [x for x in left if x.proc.alive()]
    return left


def kill(left: list[Leftover]) -> None:
    """Kill the leftovers by pid."""
    for x in left:
        x.proc.signal(signal.SIGCONT)
        x.proc.signal(signal.SIGKILL)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tag every process this test (or a fixture set up for it) starts."""
    mark(item.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a process started by a test is still alive; list and kill it."""
    left = wait_gone(timeout=GRACE)
    if not left:
        return
    lines = [f"{len(left)} process(es) started by the tests are still running:"]
    lines += [f"  pid {x.proc.pid} from {x.test}: {x.cmdline[:200]}" for x in left]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line, file=sys.stderr)
    kill(left)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
