"""Hold what is judged outside the training loop: versions, sections, the job's deadline."""

from __future__ import annotations

from dataclasses import dataclass

from .domain import Domain, check_durations, check_number

__all__ = ["OutsideLoopConfig"]


@dataclass(frozen=True)
class OutsideLoopConfig(Domain):
    """Say how long version skew, overdue sections and a missed deadline wait to alert."""

    TITLE = "outside the training loop: versions, sections, the job's deadline"

    #: How long ranks of one run must disagree on a version before DDPVersionSkew fires (ranks
    #: of a restarting job briefly mix old and new processes).
    version_skew_for: str = "2m"
    #: DDPSectionOverdue fires this long after a running section passed its own deadline.
    section_overdue_for: str = "0s"
    #: Window of the step rate that projects the job's finish time (long: an ETA, not a blip).
    eta_window: str = "15m"
    #: DDPJobWillMissDeadline fires when the projected finish is later than the job's deadline
    #: minus this many seconds (time to checkpoint and resubmit before the kill).
    job_deadline_margin_seconds: float = 1800.0
    #: How long the projection must miss before DDPJobWillMissDeadline fires.
    job_deadline_for: str = "10m"
    #: How long a rank must report a variable it cannot use before DDPExporterMisconfigured.
    misconfigured_for: str = "1m"

    def validate(self) -> None:
        """Refuse a ``for`` that is no duration, an empty ETA window and a negative margin."""
        check_durations(
            self,
            ("version_skew_for", "section_overdue_for", "job_deadline_for", "misconfigured_for"),
        )
        check_durations(self, ("eta_window",), positive=True)
        check_number(self, "job_deadline_margin_seconds", 0.0)
