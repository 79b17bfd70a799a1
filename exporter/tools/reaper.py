"""Stop a launched process and every process under it, leaving nothing running.

torchrun starts each worker in a session of its own, so killing torchrun's process group
leaves the workers running, and a SIGKILLed torchrun orphans them for good. :func:`stop_tree`
therefore lets the launcher tear its workers down first (SIGCONT, then SIGTERM, then a wait),
and only then kills, by pid, whatever of the tree it saw is still alive: never by a name
pattern, and only a process whose start time still matches (pids are reused).

Linux reads the tree from ``/proc``; elsewhere only the launched process itself is known.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from .. import procfs

__all__ = [
    "Interrupted",
    "Proc",
    "become_subreaper",
    "descendants",
    "raise_on_signals",
    "stop_adopted",
    "stop_tree",
]

_PR_SET_CHILD_SUBREAPER = 36
#: Seconds that processes a launcher left behind get to act on our own SIGTERM.
ORPHAN_GRACE = 2.0


@dataclass(frozen=True)
class Proc:
    """One process, identified by pid and start time (so a reused pid is not mistaken for it)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        """Return the running process ``pid``, or None when there is none (or it is a zombie)."""
        found = procfs.stat(pid)
        if found is None or found.state == "Z":
            return None
        return cls(pid, found.start_ticks)

    def alive(self) -> bool:
        """Say whether this very process still runs (not exited, not a zombie, pid not reused)."""
        found = procfs.stat(self.pid)
        return found is not None and found.state != "Z" and found.start_ticks == self.start

    def signal(self, sig: int) -> None:
        """Send ``sig`` if this very process still runs."""
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def descendants(pid: int) -> list[Proc]:
    """Return every running process below ``pid`` (children, grandchildren, ...)."""
    children: dict[int, list[Proc]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        found = procfs.stat(int(name))
        if found is not None and found.state != "Z":
            children.setdefault(found.ppid, []).append(Proc(int(name), found.start_ticks))
    out: list[Proc] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child.pid)
    return out


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux), so a launcher that dies cannot hide its workers."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by :func:`raise_on_signals` when a stop signal arrives."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_signals(*signums: int) -> None:
    """Turn ``signums`` (default SIGTERM and SIGHUP) into :class:`Interrupted` in the main thread.

    Python dies on SIGTERM without running ``finally`` blocks; what ``timeout``, a service
    manager, ``docker stop`` or a cancelled CI job sends must clean up like Ctrl-C does.
    """

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    for signum in signums or (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, handler)


def _reap(procs: list[Proc]) -> None:
    """Collect exit statuses of adopted orphans (only those pids, never a Popen's)."""
    for p in procs:
        try:
            os.waitpid(p.pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def stop_tree(proc: subprocess.Popen, grace: float = 15.0, kill_wait: float = 10.0) -> list[Proc]:
    """Stop ``proc`` and everything below it; return what had to be SIGKILLed.

    SIGCONT wakes stopped (SIGSTOPped) processes so that they can act on SIGTERM; SIGTERM
    to ``proc`` lets a launcher such as torchrun stop its workers itself. Processes the
    launcher leaves behind when it exits get a SIGTERM of their own and :data:`ORPHAN_GRACE`
    seconds. After ``grace`` seconds at most, every process of the tree seen so far that
    still runs is SIGKILLed by pid.
    """
    seen: dict[int, Proc] = {}

    def look() -> None:
        for p in descendants(proc.pid):
            seen.setdefault(p.pid, p)

    look()
    if proc.poll() is None:
        for p in seen.values():
            p.signal(signal.SIGCONT)
        try:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    orphaned_until = None
    while time.monotonic() < deadline:
        if proc.poll() is None:
            look()  # children started during the teardown count too
        else:
            left = [p for p in seen.values() if p.alive()]
            if not left:
                break
            if orphaned_until is None:
                # The launcher is gone and left these behind: ask them ourselves, briefly.
                for p in left:
                    p.signal(signal.SIGTERM)
                orphaned_until = time.monotonic() + min(ORPHAN_GRACE, grace)
            elif time.monotonic() >= orphaned_until:
                break
        time.sleep(0.05)
    killed = [p for p in seen.values() if p.alive()]
    for p in killed:
        p.signal(signal.SIGCONT)
        p.signal(signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=kill_wait)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + kill_wait
    while any(p.alive() for p in killed) and time.monotonic() < deadline:
        _reap(killed)
        time.sleep(0.05)
    _reap(killed)
    return killed


def stop_adopted(grace: float = 0.0) -> None:
    """Stop every process this (subreaper) process adopted: nothing outlives it.

    ``grace`` > 0: SIGTERM first and that many seconds to act on it (a job's uploader
    finishing); then, or at once, SIGKILL.
    """
    left = descendants(os.getpid())
    for p in left:
        p.signal(signal.SIGCONT)
        if grace > 0:
            p.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.alive() for p in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in left:
        p.signal(signal.SIGKILL)
