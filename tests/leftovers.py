"""Find processes the tests started that are still alive: nothing may outlive the test session.

Import its ``pytest_*`` hooks into a conftest to use it, and call :func:`unwind_on_signals` there.
Every process a test starts inherits the environment variable :data:`MARK`, set to
``<session pid>/<pytest pid>/<test node id>`` before each test's set-up (torchrun passes it on
to its workers, Popen to Prometheus); the session pid is the pytest-xdist controller's in a
parallel run, else pytest's own. At the end of a worker any live process carrying its mark is a
leak, reported with the test that started it, then killed; at the end of the session, the
same for every process of the session: a controller ended by SIGTERM ends its workers without
their clean-up, and their tests' jobs would live on.
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
    "pytest_configure",
    "pytest_configure_node",
    "pytest_runtest_setup",
    "pytest_sessionfinish",
    "unwind_on_signals",
    "wait_gone",
]

MARK = "DDP_EXPORTER_TEST_PROCESS"
#: Seconds that processes still being torn down at the session's end get before they count.
GRACE = float(os.environ.get("DDP_EXPORTER_TEST_LEFTOVER_GRACE", "15"))


#: The key of the session pid in an xdist worker's ``workerinput``.
_SESSION_KEY = "ddp_exporter_test_session"
#: The pid of the session's first process: xdist's controller, or pytest alone.
_session = os.getpid()


def _prefix() -> str:
    """Return the mark of what this process reaps: all of the session in its first process."""
    pid = os.getpid()
    return f"{_session}/" if pid == _session else f"{_session}/{pid}/"


def mark(nodeid: str) -> None:
    """Tag the processes started from now on with this session, this process and ``nodeid``."""
    os.environ[MARK] = f"{_session}/{os.getpid()}/{nodeid}"


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def unwind_on_signals() -> None:
    """Let SIGTERM and SIGHUP (a CI timeout, a closed terminal) unwind the session like Ctrl-C.

    Every test's context managers then stop what they started, and the session's end reaps the
    rest. Without this the default action kills pytest alone and its jobs' ranks live on.
    """
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _interrupted)


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


def leftovers() -> list[Leftover]:
    """Return the live processes (not zombies) that carry the mark this process reaps."""
    prefix, me = _prefix(), os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        value = _environ(int(name)).get(MARK, "")
        proc = Proc.of(int(name))
        if value.startswith(prefix) and proc is not None:
            test = value.split("/", 2)[-1]  # <session pid>/<pytest pid>/<test node id>
            out.append(Leftover(proc, test, _cmdline(proc.pid)))
    return out


def wait_gone(timeout: float) -> list[Leftover]:
    """Give processes being torn down ``timeout`` seconds; return those still alive.

    Each look finds them anew: a launcher being torn down (torchrun restarting its workers) may
    start processes meanwhile.
    """
    deadline = time.monotonic() + timeout
    left = _settled()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _settled()
    return left


def _settled() -> list[Leftover]:
    """Return the leftovers; when one look finds none, what a second look finds.

    A look lists /proc once, then reads each process: a launcher that starts a worker and exits
    while the look runs is gone when read, and its worker is not in the listing. The worker
    was started before that look ended, so the next look's listing has it.
    """
    return leftovers() or leftovers()


def kill(left: list[Leftover], timeout: float = 10.0) -> list[Leftover]:
    """Kill the leftovers by pid, and what they start while they die, until none is left or
    ``timeout`` passed; return every process killed."""
    killed = {x.proc.pid: x for x in left}
    deadline = time.monotonic() + timeout
    while left:
        for x in left:
            x.proc.signal(signal.SIGCONT)
            x.proc.signal(signal.SIGKILL)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
        left = _settled()  # a launcher killed after starting a worker leaves it orphaned
        killed.update((x.proc.pid, x) for x in left)
    return list(killed.values())


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, take the controller's pid as the session's."""
    global _session
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _SESSION_KEY in workerinput:
        _session = int(workerinput[_SESSION_KEY])


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """Hand the session's pid to each xdist worker (an xdist hook: absent without it)."""
    node.workerinput[_SESSION_KEY] = _session  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tag every process this test (or a fixture set up for it) starts."""
    mark(item.nodeid)


# After xdist's own session end, which ends the workers: what they left is then known.
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a process started by a test is still alive; list and kill it."""
    left = wait_gone(timeout=GRACE)
    if not left:
        return
    left = kill(left)
    lines = [f"{len(left)} process(es) started by the tests were still running:"]
    lines += [f"  pid {x.proc.pid} from {x.test}: {x.cmdline[:200]}" for x in left]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line, file=sys.stderr)
    if session.exitstatus != pytest.ExitCode.INTERRUPTED:  # an interrupted session says so
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
