"""What a rank's background services share: who the rank is and where it reports.

The hang watcher and the goodput account both run beside the training loop of one rank, on the
job's store, reading the same step recorder and declared sections, at the heartbeat's interval,
and only one rank of the job (the monitoring rank) decides; the assembly builds this once and
hands it to both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ErrorCounter
from ..settings import Identity
from .recorder import Recorder
from .sections import SectionRegistry

__all__ = ["RankContext"]


@dataclass(frozen=True)
class RankContext:
    """One rank's place in the job, as its background services see it."""

    identity: Identity
    #: The job's c10d store (a client, or the host on rank 0); None where there is none.
    store: Any
    recorder: Recorder
    sections: SectionRegistry
    #: The heartbeat interval: how often a service publishes and looks.
    interval_s: float
    #: Whether this rank decides for the job (the monitoring rank).
    monitor: bool
    #: Where the hang dumps and the run's goodput files go.
    dump_dir: str
    errors: ErrorCounter
    #: The step the run resumed from (a restart), None when it started afresh.
    start_step: int | None = None
    #: The thread that trains (:mod:`exporter.sources.training`); None: the main thread.
    training_thread: int | None = None
