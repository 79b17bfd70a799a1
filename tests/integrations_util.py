"""Run a torchrun worker script to completion and leave none of its processes behind."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from harness import Job


@contextlib.contextmanager
def worker_job(script: str, args: list[str]) -> Iterator[Job]:
    """Yield a 2-rank Job of ``script``; on exit stop torchrun and its ranks (Job.kill)."""
    job = Job(2, args, module=script, env={"OMP_NUM_THREADS": "1"})
    try:
        yield job
    finally:
        job.kill()
