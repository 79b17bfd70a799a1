"""Run a torchrun worker script to completion and leave none of its processes behind."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

from harness import Job


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The command name may hold spaces: the fields after ")" are fixed.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


@contextlib.contextmanager
def worker_job(script: str, args: list[str]) -> Iterator[Job]:
    """Yield a 2-rank Job of ``script``; on exit kill its ranks too, then torchrun's group.

    torchrun starts each rank in a session of its own, so killing torchrun's process group
    alone would leave ranks running when a test fails or times out.
    """
    job = Job(2, args, module=script, env={"OMP_NUM_THREADS": "1"})
    try:
        yield job
    finally:
        for pid in _children(job.proc.pid):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        job.kill()
