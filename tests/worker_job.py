"""Run a worker script of tests/workers under torchrun, plus a FAST-rules Prometheus.

Stopping the job (torchrun and its workers, which live in sessions of their own) is
:class:`harness.Job`'s: :func:`exporter.tools.reaper.stop_tree`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from harness import Job
from promstack import Prometheus, run_prometheus

from exporter.mixin.config import FAST
from exporter.mixin.rules import render_rules

__all__ = ["WorkerJob", "fast_prometheus", "firing", "worker_args"]

WORKERS = Path(__file__).parent / "workers"


class WorkerJob(Job):
    """A torchrun job of ``tests/workers/<script>``."""

    def __init__(self, nproc: int, script: str, args: list[str], env: dict[str, str]) -> None:
        self.script = str(WORKERS / script)
        base = {"OMP_NUM_THREADS": "1"}
        super().__init__(nproc, args, env={**base, **env}, module=self.script)


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
