"""Learn the job's wall-clock limit and total work, so the rules can project whether it fits.

The deadline comes from ``DDP_EXPORTER_JOB_DEADLINE`` when set, else from Slurm's
``SLURM_JOB_END_TIME`` (Unix time, Slurm 23.02+). ``DDP_EXPORTER_JOB_DEADLINE`` is either a Unix
time (``1767225600``) or a duration with units (``72h``, ``90m``, ``3600s``, ``1d12h``) counted
from the **job's start**:

- under torchrun (``TORCHELASTIC_RUN_ID`` set): the start of the worker's parent process, the
  torchrun agent, which outlives worker restarts, so a restarted worker keeps the same deadline;
- otherwise (srun, mpirun, a plain ``python``): the start of this rank's own process.

Both variables and their parsing live in :mod:`exporter.settings`. Start times are read from
``/proc`` (Linux); elsewhere the time this module was imported is used. For limits counted from an earlier moment (SageMaker's ``MaxRuntimeInSeconds`` counts from the
training job's start, before the container runs Python), prefer an absolute Unix time computed by
the launcher, e.g. ``DDP_EXPORTER_JOB_DEADLINE=$(( $(date +%s) + 72*3600 ))``.

The total work is ``instrument(total_steps=...)``, or the DataLoader's length times
``instrument(epochs=...)``, in the unit of ``ddp_steps_total`` (optimizer steps when the optimizer
is instrumented: with gradient accumulation pass ``total_steps``). It counts the steps this
process will run: when resuming from a checkpoint, pass the steps still to do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import procfs, settings

__all__ = ["JobClock", "job_start_unix", "process_start_unix", "resolve_job_clock"]

_IMPORTED_UNIX = time.time()


@dataclass(frozen=True)
class JobClock:
    """The job's wall-clock deadline (Unix time) and total steps; None where unknown."""

    deadline_unix: float | None = None
    total_steps: int | None = None
    #: Which variable the deadline came from (for log lines), "" when none.
    deadline_source: str = ""


def process_start_unix(pid: int) -> float | None:
    """Return the Unix start time of process ``pid`` from /proc, or None where unreadable."""
    return procfs.start_unix(pid)


def job_start_unix(environ: Mapping[str, str] | None = None) -> float:
    """Return the job's start: torchrun's start under torchrun, else this process's start."""
    if settings.under_torchrun(environ):
        start = process_start_unix(os.getppid())
        if start is not None:
            return start
    start = process_start_unix(os.getpid())
    return _IMPORTED_UNIX if start is None else start


def _deadline_from_env(environ: Mapping[str, str]) -> tuple[float | None, str]:
    found = settings.job_deadline_raw(environ)
    if found is None:
        return None, ""
    name, raw = found
    # A duration counts from the job's start; Slurm's end time is always absolute.
    start = job_start_unix(environ) if name == settings.JOB_DEADLINE else 0.0
    return settings.parse_deadline(name, raw, start), name


def resolve_job_clock(
    *,
    total_steps: int | None = None,
    epochs: int | None = None,
    dataloader: Any = None,
    environ: Mapping[str, str] | None = None,
) -> JobClock:
    """Return the job's deadline (environment) and total steps (arguments), validated.

    Raises ValueError naming the variable or keyword for a malformed value.
    """
    environ = os.environ if environ is None else environ
    deadline, source = _deadline_from_env(environ)
    if total_steps is not None and epochs is not None:
        raise ValueError("exporter.instrument(): give total_steps or epochs, not both")
    steps = None
    if total_steps is not None:
        steps = settings.positive_int("total_steps", total_steps)
    elif epochs is not None:
        epochs = settings.positive_int("epochs", epochs)
        if dataloader is None:
            raise ValueError(
                "exporter.instrument(epochs=...) needs dataloader=... to count steps per epoch; "
                "or pass total_steps=..."
            )
        try:
            per_epoch = len(dataloader)
        except TypeError:
            raise ValueError(
                "exporter.instrument(epochs=...): the DataLoader has no length (an "
                "IterableDataset?); pass total_steps=... instead"
            ) from None
        steps = per_epoch * epochs if per_epoch > 0 else None
    return JobClock(deadline, steps, source)
