"""The /proc readers, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import wait_for

from exporter import procfs

pytestmark = pytest.mark.unit

# Busy until killed, pinned to one CPU: two of them share it, each waiting for the other.
BUSY = "import os; os.sched_setaffinity(0, {int(os.environ['CPU'])})\nwhile True: pass\n"


def test_run_delay_is_the_time_threads_waited_for_a_cpu():
    cpu = min(os.sched_getaffinity(0))
    env = {**os.environ, "CPU": str(cpu)}
    busy = [subprocess.Popen([sys.executable, "-c", BUSY], env=env) for _ in range(2)]
    try:
        # Sharing one CPU, each waits for the other about half the time: it adds up.
        wait_for(
            lambda: all(max((procfs.run_delays(p.pid) or {0: 0.0}).values()) > 0.2 for p in busy),
            60,
            "both busy processes waiting for their CPU",
        )
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert procfs.run_delays(busy[0].pid) is None  # gone: the kernel says nothing
    own = procfs.run_delays()
    assert own is not None and all(w >= 0.0 for w in own.values()), own
