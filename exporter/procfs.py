"""Read a process's state, parent, start time and CPU waits from Linux's /proc: the one reader.

The launcher's start (the job's wall clock) and the reaper's process tree both need
``/proc/<pid>/stat``, whose second field (the command name, in parentheses) may itself contain
spaces or parentheses: the fields are counted from the last ``)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ProcStat", "age_s", "boot_time", "run_delays", "start_unix", "stat"]


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the exporter uses."""

    #: One letter: R running, S sleeping, T stopped, Z zombie, ...
    state: str
    ppid: int
    #: Start time in clock ticks after boot (field 22).
    start_ticks: int


def stat(pid: int) -> ProcStat | None:
    """Return the state, parent and start ticks of ``pid``, or None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return ProcStat(fields[0], int(fields[1]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def boot_time() -> float | None:
    """Return the Unix time the machine booted (``btime`` of /proc/stat), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return float(next(int(line.split()[1]) for line in f if line.startswith("btime ")))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def start_unix(pid: int) -> float | None:
    """Return the Unix time process ``pid`` started, or None where unreadable."""
    found, booted = stat(pid), boot_time()
    if found is None or booted is None:
        return None
    return booted + found.start_ticks / os.sysconf("SC_CLK_TCK")


def _uptime() -> float | None:
    """Return seconds since boot (``/proc/uptime``, 10 ms resolution), or None."""
    try:
        with open("/proc/uptime", encoding="ascii") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def age_s(pid: int) -> float | None:
    """Return how long process ``pid`` has run, in seconds (10 ms resolution), or None.

    Unlike :func:`start_unix`, whose boot time is whole seconds, this is exact to a clock tick:
    ``time.time() - age_s(pid)`` is when the process started.
    """
    found, up = stat(pid), _uptime()
    if found is None or up is None:
        return None
    return max(0.0, up - found.start_ticks / os.sysconf("SC_CLK_TCK"))


def run_delays(pid: int | str = "self") -> dict[int, float] | None:
    """Return, per live thread of ``pid``, the seconds it spent runnable but waiting for a CPU
    (the scheduler's run delay, second field of ``/proc/<pid>/task/<tid>/schedstat``); None
    where the kernel does not say."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out: dict[int, float] = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                out[int(tid)] = int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return out or None
