"""Run a worker script under torchrun and kill its workers too, plus a FAST-rules Prometheus.

torchrun starts each worker in its own session, so killing torchrun's process group leaves
them running. :class:`WorkerJob` also kills the workers: torchrun's children found in /proc,
and the pids the workers announce (``worker pid N``) in case torchrun is already gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

from harness import Job, wait_for
from promstack import Prometheus, run_prometheus

from exporter.mixin.config import FAST
from exporter.mixin.rules import render_rules

__all__ = ["WorkerJob", "fast_prometheus", "firing", "worker_args"]

WORKERS = Path(__file__).parent / "workers"
_PID_LINE = re.compile(r"worker pid (\d+)")


def _children(pid: int) -> set[int]:
    """Return the direct children of ``pid`` (all its threads'), empty when it is gone."""
    out: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out |= {int(p) for p in f.read().split()}
    except OSError:
        pass
    return out


def _alive(pid: int) -> bool:
    """Return True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _is_worker(pid: int, script: str) -> bool:
    """Return True when ``pid`` runs ``script`` (never kill a recycled pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return script.encode() in f.read()
    except OSError:
        return False


class WorkerJob(Job):
    """A torchrun job of ``tests/workers/<script>`` whose workers are killed with it."""

    def __init__(self, nproc: int, script: str, args: list[str], env: dict[str, str]) -> None:
        self.script = str(WORKERS / script)
        base = {"OMP_NUM_THREADS": "1"}
        super().__init__(nproc, args, env={**base, **env}, module=self.script)

    def worker_pids(self) -> set[int]:
        """Return the pids of this job's workers that are still running."""
        pids = _children(self.proc.pid) | {int(p) for p in _PID_LINE.findall("".join(self.lines))}
        return {p for p in pids if _is_worker(p, self.script) and _alive(p)}

    def kill(self) -> None:
        """Kill the workers (SIGCONT first, in case one is stopped), then torchrun's group."""
        pids = self.worker_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        super().kill()
        wait_for(lambda: not any(_alive(p) for p in pids), 30, "the workers to be gone")


def worker_args(*args: object) -> list[str]:
    """Return ``args`` as strings (torchrun passes them to the worker)."""
    return [str(a) for a in args]


@contextlib.contextmanager
def fast_prometheus(workdir: Path, urls: dict[int, str]) -> Iterator[Prometheus]:
    """Start Prometheus scraping ``urls`` every second and evaluating the FAST rules."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "rules.yml").write_text(render_rules(FAST))
    targets = [u.split("//", 1)[1].split("/", 1)[0] for u in urls.values()]
    config = {
        "global": {
            "scrape_interval": FAST.scrape_interval,
            "evaluation_interval": FAST.evaluation_interval,
            "scrape_timeout": "900ms",
        },
        "rule_files": [str(workdir / "rules.yml")],
        "scrape_configs": [
            {
                "job_name": FAST.job,
                "honor_labels": True,
                "static_configs": [{"targets": targets}],
            }
        ],
    }
    with run_prometheus(workdir, config) as prom:
        yield prom


def firing(prom: Prometheus, alertname: str) -> list[dict]:
    """Return the firing alerts named ``alertname`` with their labels and annotations."""
    return [
        a
        for a in prom.api("alerts")["alerts"]
        if a["labels"].get("alertname") == alertname and a.get("state") == "firing"
    ]
